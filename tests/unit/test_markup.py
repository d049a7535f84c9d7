"""preserve_format's markup: inline Markdown and HTML to HY-MT1.5's <sN> tags and back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hymt_serve.request.errors import InvalidRequest
from hymt_serve.request.markup import TAG, Markup, restore, to_tags, unwrap_target


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
    assert to_tags(text, "markdown") == (text, Markup())


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
