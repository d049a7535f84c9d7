"""preserve_format's markup: inline Markdown and HTML to HY-MT1.5's <sN> tags and back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hymt_serve.request.errors import InvalidRequest
from hymt_serve.request.markup import TAG, restore, to_tags, unwrap_target


def test_markdown_spans_become_numbered_tags() -> None:
    text = 'A **bold *and nested* span**, a [link](https://x.org "t"), `code` and https://a.b/c.'
    tagged, markup = to_tags(text, "markdown")
    assert tagged == (
        "A <s1>bold <s2>and nested</s2> span</s1>, a <s3>link</s3>, <s4></s4> and <s5></s5>."
    )
    assert markup.opens[3:] == ("`code`", "https://a.b/c")  # untranslated stand-ins
    assert markup.closes[2] == '](https://x.org "t")'


@pytest.mark.parametrize(
    "text",
    ["snake_case_name stays", "2*3*4 = 24", "a * b * c", "price: 5 $ ** 2", "[not a link]"],
)
def test_markdown_lookalikes_stay_text(text: str) -> None:
    tagged, markup = to_tags(text, "markdown")
    assert tagged == text and markup.opens == markup.closes == ()


def test_html_pairs_wrap_and_the_rest_stands_in() -> None:
    text = (
        '<a href="/x">here</a> <B>now <i>please</i></B><br/><code>rm <b>x</b></code>'
        "<!-- c --><p>open"
    )
    tagged, markup = to_tags(text, "html")
    assert tagged == (
        "<s1>here</s1> <s2>now <s3>please</s3></s2><s4></s4><s5></s5><s6></s6><s7></s7>open"
    )
    assert markup.opens[4] == "<code>rm <b>x</b></code>" and markup.closes[4] == ""


def test_a_translation_gets_its_markup_back() -> None:
    _, markup = to_tags("Press **Save** to keep [the file](f.txt).", "markdown")
    answer = "<s2>文件</s2>请按<s1>保存</s1>。"  # the model moved and translated the spans
    assert restore(answer, markup) == ("[文件](f.txt)请按**保存**。", 0)


def test_lost_and_invented_tags() -> None:
    _, markup = to_tags("A **b** and `c` and *d*.", "markdown")
    # s1 whole, s2 (a stand-in) gone, s3 half, s9 invented.
    restored, lost = restore("<s1>B</s1> <s3>D <s9>x</s9>", markup)
    assert restored == "**B** D x" and lost == 2
    # as a reply puts them back: nothing of the source's markup is lost, nothing invented
    restored, lost = restore("<s1>B</s1> <s3>D <s9>x</s9>", markup, keep_lost=True)
    assert restored == "**B** *`c` D* x" and lost == 2


def test_text_with_tags_must_say_tags() -> None:
    with pytest.raises(InvalidRequest, match="'tags'"):
        to_tags("<s1>a</s1> **b**", "markdown")


@pytest.mark.parametrize(
    ("output", "text"),
    [
        ("<target>你好<s1>世界</s1></target>", "你好<s1>世界</s1>"),
        ("  <target>你好\n", "你好"),  # cut before its end: no closing tag
        ("你好</target>", "你好"),
        ("你好", "你好"),
    ],
)
def test_unwrap_target(output: str, text: str) -> None:
    assert unwrap_target(output) == text


markdownish = st.text(alphabet=st.sampled_from(list("ab *_`[]()<>/:.sh~ \n1你")), max_size=60)


@given(markdownish, st.sampled_from(["markdown", "html"]))
def test_tags_returned_as_sent_give_the_text_back(text: str, kind: str) -> None:
    if TAG.search(text):
        return
    tagged, markup = to_tags(text, kind)
    assert restore(tagged, markup) == (text, 0)


@given(markdownish, st.sampled_from(["markdown", "html", "text"]))
def test_a_document_segment_returned_as_sent_is_the_segment(text: str, kind: str) -> None:
    tagged, markup = to_tags(text, kind, tags_in_text=True)
    assert restore(tagged, markup, keep_lost=True) == (text, 0)


def test_a_dropped_link_and_image_keep_their_targets_and_titles() -> None:
    source = 'Order [parts](https://example.com/p?id=42), see ![the logo](img/l.png "Logo").'
    _, markup = to_tags(source, "markdown")
    restored, lost = restore("BESTELLE TEILE, SIEHE DAS LOGO.", markup, keep_lost=True)
    assert (
        restored
        == 'BESTELLE [TEILE,](https://example.com/p?id=42) SIEHE ![DAS LOGO.](img/l.png "Logo")'
    )
    assert lost == 2


def test_a_dropped_pair_wraps_its_source_text_where_the_model_kept_it() -> None:
    _, markup = to_tags("Call **Ada** and <b>Bob</b> today.", "markdown")
    assert restore("Ruf Bob und Ada heute an.", markup, keep_lost=True) == (
        "Ruf <b>Bob</b> und **Ada** heute an.",
        2,
    )


def test_a_subtitle_in_italics_stays_in_italics() -> None:
    _, markup = to_tags("<i>Hello there.</i>", "html")
    assert restore("Hallo zusammen.", markup, keep_lost=True) == ("<i>Hallo zusammen.</i>", 1)


LINK, TIME = '<a href="/x" title="T">', '<time datetime="12:00">'


@pytest.mark.parametrize(
    ("output", "restored", "lost"),
    [
        # repeated: the first whole pair counts
        ("<s1>Hier</s1> <s1>um</s1> <s2>zwölf</s2>", f"{LINK}Hier</a> um {TIME}zwölf</time>", 0),
        # close before open: the text between
        ("</s1>Hier<s1> um <s2>zwölf</s2>", f"{LINK}Hier</a> um {TIME}zwölf</time>", 0),
        # crossing: the outer pair closes later
        ("<s1>Hier <s2>um</s1> zwölf</s2>", f"{LINK}Hier {TIME}um zwölf</time></a>", 0),
        # half a pair: the words after it (as many as in the source); a tag the source lacks
        # dropped; a tag cut off at the end dropped
        ("<s1>Hier um <s7>x</s7> <s2>Uhr</s2></s", f"{LINK}Hier</a> um x {TIME}Uhr</time>", 1),
        # left empty: put back around words
        ("<s1></s1>Hier um <s2> </s2>zwölf", f"{LINK}Hier</a> um  {TIME}zwölf</time>", 0),
    ],
)
def test_tags_dropped_repeated_moved_or_crossed_come_back_once_well_nested(
    output: str, restored: str, lost: int
) -> None:
    _, markup = to_tags(f"{LINK}here</a> at {TIME}noon</time>", "html")
    assert restore(output, markup, keep_lost=True) == (restored, lost)


@pytest.mark.parametrize(
    ("kind", "text", "tagged"),
    [
        (
            "text",
            "Mail a.b+c@x.example.org, or 联系support@x.com。",
            "Mail <s1></s1>, or 联系<s2></s2>。",
        ),
        ("markdown", "**Write to me@x.org** now", "<s1>Write to <s2></s2></s1> now"),
        (
            "html",
            "<p>See https://x.org/a. Or me@x.org</p>",
            "<s1>See <s2></s2>. Or <s3></s3></s1>",
        ),
    ],
)
def test_email_addresses_and_bare_urls_are_stand_ins(kind: str, text: str, tagged: str) -> None:
    assert to_tags(text, kind)[0] == tagged


def test_a_url_the_model_glued_to_a_word_is_kept_apart() -> None:
    _, markup = to_tags("See https://x.org/a and me@x.org now", "text")
    restored, _ = restore("Siehe<s1></s1>und<s2></s2>jetzt", markup, keep_lost=True)
    assert restored == "Siehe https://x.org/a und me@x.org jetzt"
