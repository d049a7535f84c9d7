"""XLIFF 1.2 and 2.x through the document pipeline (split, tag, translate, restore, rebuild):
targets written with every inline code, states and the target language set, what must not be
translated left alone, everything outside the targets unchanged (an XML comparison of the
files without their targets, and bytes where a file is rewritten in one place), a careless
translator losing no code, and unsafe or malformed files refused with their line named."""

from __future__ import annotations

import copy
import random
import re
import xml.etree.ElementTree as ET
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from localisation_files import WORDS, mark_words, translate_file
from test_document_fidelity import careless

from hymt_serve.request.errors import InvalidRequest
from hymt_serve.request.localisation_xliff import parse_xliff

NS1 = "urn:oasis:names:tc:xliff:document:1.2"
NS2 = "urn:oasis:names:tc:xliff:document:2.0"
# Inline codes whose content is native code, not text (their text is never translated).
NATIVE = {"bpt", "ept", "ph", "it", "sub"}

XLIFF_12 = """<?xml version="1.0" encoding="UTF-8"?>
<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2">
  <file source-language="en" target-language="de" datatype="html" original="page.html">
    <header><note>Keep me</note></header>
    <body>
      <trans-unit id="plain"><source>Open the file</source></trans-unit>
      <trans-unit id="codes">
        <source>Click <g id="1" ctype="bold">here &amp; <x id="2" ctype="image"/> now</g>, \
then <bpt id="3">&lt;a href="x"&gt;</bpt>read<ept id="3">&lt;/a&gt;</ept> <ph id="4">{name}</ph>.\
</source>
        <note>A note</note>
      </trans-unit>
      <trans-unit id="rtl"><source>مرحبا <g id="1">بالعالم</g> שלום</source>\
<target state="new"></target></trans-unit>
      <trans-unit id="cjk"><source>你好世界。<mrk mtype="protected" mid="p1">Hunyuan</mrk>\
こんにちは</source><target state="needs-translation">old</target></trans-unit>
      <trans-unit id="final"><source>Done</source><target state="final">Fertig</target></trans-unit>
      <trans-unit id="kept"><source>Seen</source><target>Gesehen</target></trans-unit>
      <trans-unit id="approved" approved="yes"><source>Yes</source><target state="new">Ja</target>\
</trans-unit>
      <trans-unit id="no" translate="no"><source>Brand</source></trans-unit>
      <group id="g" translate="no"><trans-unit id="inherited"><source>Also kept</source>\
</trans-unit></group>
      <group id="open"><trans-unit id="nested"><source>In a group</source></trans-unit></group>
      <trans-unit id="segmented"><source>One. Two.</source><seg-source><mrk mtype="seg" mid="1">\
One.</mrk> <mrk mtype="seg" mid="2">Two.</mrk></seg-source></trans-unit>
      <trans-unit id="empty"><source>Empty target</source><target/></trans-unit>
      <trans-unit id="marks"><source>e\u0301te\u0301 नमस्ते สวัสดีครับ</source></trans-unit>
    </body>
  </file>
</xliff>
"""

XLIFF_20 = """<?xml version="1.0" encoding="UTF-8"?>
<xliff xmlns="urn:oasis:names:tc:xliff:document:2.0" version="2.0" srcLang="en" trgLang="de">
  <file id="f1">
    <notes><note>File note</note></notes>
    <unit id="u1">
      <originalData><data id="d1">&lt;b&gt;</data><data id="d2">&lt;/b&gt;</data></originalData>
      <segment id="s1">
        <source>Press <pc id="1" dataRefStart="d1" dataRefEnd="d2">Save</pc> and <ph id="2"/> \
then <sc id="3"/>go<ec startRef="3"/> <sm id="m" translate="no"/>Hunyuan MT<em startRef="m"/>.\
</source>
      </segment>
      <ignorable><source> </source></ignorable>
      <segment id="s2" state="final"><source>Kept</source><target>Behalten</target></segment>
      <segment id="s3" state="initial"><source>שלום <mrk id="k" translate="no">Brand</mrk> עולם\
</source><target xml:lang="de">alt</target></segment>
      <segment id="s4"><source>Already</source><target>Schon</target></segment>
      <segment id="s5"><source>你好世界</source><target></target></segment>
    </unit>
    <unit id="u2" translate="no"><segment><source>Not this</source></segment></unit>
    <group id="g1"><unit id="u3"><segment id="s6"><source>مرحبا بالعالم <cp hex="0001"/>\
</source></segment></unit></group>
  </file>
  <file id="f2" translate="no"><unit id="u4"><segment><source>Nor this</source></segment></unit>\
</file>
</xliff>
"""


def _tree(text: str) -> ET.Element:
    return ET.fromstring(text.encode("utf-8"))


def _by_id(root: ET.Element, tag: str) -> dict[str, ET.Element]:
    return {e.get("id", ""): e for e in root.iter(tag)}


def _native(element: ET.Element) -> bool:
    name = element.tag.split("}")[1]
    protected = element.get("mtype") == "protected" or element.get("translate") == "no"
    return name in NATIVE or (name == "mrk" and protected)


def _expected(source: ET.Element) -> ET.Element:
    """``source``'s content with every text the pipeline translates marked."""
    out = copy.deepcopy(source)
    _mark(out)
    return out


def _mark(element: ET.Element) -> None:
    element.text = mark_words(element.text or "") or None
    skipping = None  # inside a 2.x <sm translate="no"/> ... <em/> range: its id
    for child in element:
        if skipping is not None:
            if child.tag.endswith("}em") and child.get("startRef") == skipping:
                skipping = None
                child.tail = mark_words(child.tail or "") or None
            continue
        if not _native(child):
            _mark(child)
        if child.tag.endswith("}sm") and child.get("translate") == "no":
            skipping = child.get("id")
            continue
        child.tail = mark_words(child.tail or "") or None


def _content(element: ET.Element) -> str:
    """An element's content (text and children) in canonical XML."""
    inner = copy.deepcopy(element)
    inner.tag, inner.attrib = "c", {}
    return ET.canonicalize(ET.tostring(inner, encoding="unicode"))


def _without_targets(text: str, drop: tuple[str, ...]) -> str:
    """The document in canonical XML without its targets and the attributes in ``drop``."""
    root = _tree(text)
    for parent in root.iter():
        children = list(parent)
        for index, child in enumerate(children):
            if child.tag.endswith("}target"):  # and the white space a new one came with
                children[index - 1].tail = child.tail
                parent.remove(child)
        for name in drop:
            parent.attrib.pop(name, None)
    return ET.canonicalize(ET.tostring(root, encoding="unicode"))


def test_xliff_12_targets_states_and_everything_else_unchanged() -> None:
    out = translate_file(XLIFF_12, "xliff", mark_words, target="ar")
    root = _tree(out)
    units = _by_id(root, f"{{{NS1}}}trans-unit")
    assert root.find(f"{{{NS1}}}file").get("target-language") == "ar"  # type: ignore[union-attr]
    for unit in ("plain", "codes", "rtl", "cjk", "nested", "empty", "marks"):
        source, target = units[unit].find(f"{{{NS1}}}source"), units[unit].find(f"{{{NS1}}}target")
        assert source is not None and target is not None, unit
        assert _content(target) == _content(_expected(source)), unit
        assert target.get("state") == "translated", unit
        assert target.get("state-qualifier") == "mt-suggestion", unit
    assert units["plain"].find(f"{{{NS1}}}target").text == "«Open» «the» «file»"  # type: ignore[union-attr]
    segmented = units["segmented"].find(f"{{{NS1}}}target")
    expected = _expected(units["segmented"].find(f"{{{NS1}}}seg-source"))  # type: ignore[arg-type]
    assert segmented is not None and _content(segmented) == _content(expected)
    assert [m.get("mid") for m in segmented.iter(f"{{{NS1}}}mrk")] == ["1", "2"]
    for unit, kept in {"final": "Fertig", "kept": "Gesehen", "approved": "Ja"}.items():
        assert units[unit].find(f"{{{NS1}}}target").text == kept  # type: ignore[union-attr]
    for unit in ("no", "inherited"):
        assert units[unit].find(f"{{{NS1}}}target") is None
    assert _without_targets(out, ("target-language",)) == _without_targets(
        XLIFF_12, ("target-language",)
    )
    # the kept units come back byte for byte
    for unit in ('id="final"', 'id="kept"', 'id="approved"', 'id="no"', 'id="g"'):
        line = next(line for line in XLIFF_12.splitlines() if unit in line)
        assert line in out.splitlines()


def test_xliff_2_targets_segment_states_and_everything_else_unchanged() -> None:
    out = translate_file(XLIFF_20, "xliff", mark_words, target="zh-Hant")
    root = _tree(out)
    assert root.get("trgLang") == "zh-Hant"
    segments = {s.get("id"): s for s in root.iter(f"{{{NS2}}}segment")}
    for name in ("s1", "s3", "s5", "s6"):
        segment = segments[name]
        source, target = segment.find(f"{{{NS2}}}source"), segment.find(f"{{{NS2}}}target")
        assert source is not None and target is not None, name
        assert _content(target) == _content(_expected(source)), name
        assert segment.get("state") == "translated", name
    s1_target = segments["s1"].find(f"{{{NS2}}}target")
    assert s1_target is not None and "Hunyuan MT" in "".join(s1_target.itertext())
    assert (
        segments["s3"]
        .find(f"{{{NS2}}}target")
        .get(  # type: ignore[union-attr]
            "{http://www.w3.org/XML/1998/namespace}lang"
        )
        == "zh-Hant"
    )
    assert segments["s2"].get("state") == "final"
    assert segments["s4"].find(f"{{{NS2}}}target").text == "Schon"  # type: ignore[union-attr]
    assert segments["s4"].get("state") is None
    for unit in ("u2", "u4"):
        assert _by_id(root, f"{{{NS2}}}unit")[unit].find(f".//{{{NS2}}}target") is None
    drop = ("trgLang", "state")
    assert _without_targets(out, drop) == _without_targets(XLIFF_20, drop)


def test_a_file_rewritten_in_one_place_keeps_every_other_byte() -> None:
    """CRLF lines, single quotes, spaces in tags, character references, CDATA, comments and
    processing instructions: only the new target and the language attribute differ."""
    source = (
        "<?xml version='1.0' encoding='utf-8'?>\r\n<!-- made by hand -->\r\n"
        "<xliff  version = '1.2' xmlns='urn:oasis:names:tc:xliff:document:1.2' >\r\n"
        "\t<file original='a' source-language='en' datatype='plaintext'>\r\n"
        "\t\t<body>\r\n\t\t\t<?tool keep?>\r\n"
        "\t\t\t<trans-unit id='1'>\r\n"
        "\t\t\t\t<source xml:space='preserve'>Caf&#233; <x id='1' />time</source>\r\n"
        "\t\t\t\t<note><![CDATA[<raw> & note]]></note>\r\n"
        "\t\t\t</trans-unit>\r\n\t\t</body>\r\n\t</file>\r\n</xliff>\r\n"
    )
    out = translate_file(source, "xliff", mark_words, target="de")
    expected = source.replace(
        "datatype='plaintext'>", "datatype='plaintext' target-language=\"de\">"
    ).replace(
        "</source>\r\n",
        '</source>\r\n\t\t\t\t<target state="translated" state-qualifier="mt-suggestion">'
        "«Café» <x id='1' />«time»</target>\r\n",
    )
    assert out == expected
    # a file with nothing to translate: only the target language changes
    final = XLIFF_20.replace('<segment id="s1">', '<segment id="s1" state="final">')
    for unit in ("s3", "s5"):
        final = final.replace(f'<segment id="{unit}"', f'<segment id="{unit}" state="final"', 1)
    final = final.replace('state="final" state="initial"', 'state="final"')
    final = final.replace('<segment id="s6">', '<segment id="s6" state="final">')
    assert translate_file(final, "xliff", mark_words, target="ja") == final.replace(
        'trgLang="de"', 'trgLang="ja"'
    )
    assert translate_file("\ufeff" + final, "xliff", mark_words, "ja").startswith("\ufeff<?xml")


# Generated units: text in many scripts around nested codes of both versions.
V1_CODES = [
    ('<g id="{n}">', "</g>"),
    ('<x id="{n}"/>', None),
    ('<ph id="{n}">&lt;br/&gt;</ph>', None),
    ('<bpt id="{n}">&lt;i&gt;</bpt>', '<ept id="{n}">&lt;/i&gt;</ept>'),
    ('<bx id="{n}"/>', '<ex id="{n}"/>'),
    ('<it id="{n}" pos="open">&lt;u&gt;</it>', None),
    ('<mrk mtype="term" mid="{n}">', "</mrk>"),
    ('<mrk mtype="protected" mid="{n}">KEEP{n}</mrk>', None),
]
V2_CODES = [
    ('<pc id="{n}">', "</pc>"),
    ('<ph id="{n}"/>', None),
    ('<sc id="{n}"/>', '<ec startRef="{n}"/>'),
    ('<sm id="{n}" type="term"/>', '<em startRef="{n}"/>'),
    ('<mrk id="{n}" translate="no">KEEP{n}</mrk>', None),
    ('<mrk id="{n}" type="term">', "</mrk>"),
    ('<cp hex="0001"/>', None),
]


@st.composite
def units(draw: st.DrawFn, codes: list[tuple[str, str | None]]) -> str:
    numbers = iter(range(1, 1000))

    def content(depth: int) -> str:
        parts = []
        for _ in range(draw(st.integers(1, 4))):
            words = draw(st.lists(st.sampled_from(WORDS), min_size=0, max_size=4))
            parts.append(" ".join(words) + draw(st.sampled_from(["", " ", ". ", "! ", "? "])))
            if draw(st.booleans()):
                opening, closing = draw(st.sampled_from(codes))
                n = next(numbers)
                inner = content(depth + 1) if closing and depth < 3 else ""
                parts.append(opening.format(n=n) + inner + (closing or "").format(n=n))
        return "".join(parts).replace("&", "&amp;")

    return content(0)


def _file(version: int, sources: list[str]) -> str:
    if version == 1:
        body = "".join(
            f'<trans-unit id="t{i}"><source>{s}</source></trans-unit>\n'
            for i, s in enumerate(sources)
        )
        return f'<xliff version="1.2" xmlns="{NS1}"><file><body>\n{body}</body></file></xliff>'
    body = "".join(
        f'<unit id="u{i}"><segment><source>{s}</source></segment></unit>\n'
        for i, s in enumerate(sources)
    )
    return f'<xliff version="2.0" xmlns="{NS2}" srcLang="en">\n<file id="f">{body}</file></xliff>'


def _codes(element: ET.Element) -> Counter[str]:
    """Every inline code inside ``element``, with its attributes and native content."""
    found: Counter[str] = Counter()
    for code in element.iter():
        if code is not element:
            inner = "".join(code.itertext()) if _native(code) else ""
            found[f"{code.tag} {sorted(code.attrib.items())} {inner}"] += 1
    return found


@settings(max_examples=60, deadline=None)
@given(st.data(), st.sampled_from([1, 2]), st.sampled_from([12, 64]))
def test_generated_units_come_back_with_their_codes(
    data: st.DataObject, version: int, budget: int
) -> None:
    """Any mix of scripts and nested codes, cut into segments where a unit is long: the word
    marker gives the expected target exactly, and a careless translator that drops, repeats
    and moves tags still gives every code of each source back once, in well-formed XML."""
    sources = data.draw(st.lists(units(V1_CODES if version == 1 else V2_CODES), min_size=1))
    document = _file(version, sources)
    ns = NS1 if version == 1 else NS2
    for translator in (mark_words, careless(random.Random(data.draw(st.integers(0, 99))))):
        out = translate_file(document, "xliff", translator, budget=budget)
        pairs = _source_target_pairs(_tree(out), ns)
        assert len(pairs) == len(sources)
        for source, target in pairs:
            if not re.search(r"[^\W\d_]", "".join(source.itertext())) and translator is mark_words:
                assert _content(target) == _content(source)
            elif translator is mark_words:
                assert _content(target) == _content(_expected(source))
            assert _codes(target) == _codes(source)


def _source_target_pairs(root: ET.Element, ns: str) -> list[tuple[ET.Element, ET.Element]]:
    pairs = []
    for holder in root.iter():
        source, target = holder.find(f"{{{ns}}}source"), holder.find(f"{{{ns}}}target")
        if source is not None:
            assert target is not None, ET.tostring(holder)
            pairs.append((source, target))
    return pairs


BILLION_LAUGHS = (
    '<?xml version="1.0"?>\n<!DOCTYPE lolz [\n <!ENTITY lol "lol">\n'
    ' <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">\n]>\n'
    f'<xliff version="1.2" xmlns="{NS1}"><file><body><trans-unit id="1">'
    "<source>&lol2;</source></trans-unit></body></file></xliff>"
)
EXTERNAL = (
    '<?xml version="1.0"?>\n<!DOCTYPE x [<!ENTITY e SYSTEM "file:///etc/passwd">]>\n'
    f'<xliff version="1.2" xmlns="{NS1}"><file><body><trans-unit id="1">'
    "<source>&e;</source></trans-unit></body></file></xliff>"
)
DEEP = (
    f'<xliff version="1.2" xmlns="{NS1}"><file><body><trans-unit id="1">\n<source>'
    + '<g id="1">' * 100
    + "x"
    + "</g>" * 100
    + "</source></trans-unit></body></file></xliff>"
)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (BILLION_LAUGHS, r"line 2, column \d+: a DTD"),
        (EXTERNAL, r"line 2, column \d+: a DTD"),
        (DEEP, r"line 2, column \d+: elements nest deeper than 64 levels"),
        (f'<xliff version="1.2" xmlns="{NS1}">\n<file>\n</body></xliff>', r"line 3, column 3: "),
        ("<xliff version='1.2'><file><body>\n", r"line 2, column 1: no element found"),
        ("just text, no XML\n", r"line 1, column 1: syntax error"),
        ('<html xmlns="http://www.w3.org/1999/xhtml"/>', r"root element is \{http://www.w3.org"),
        (f'<xliff version="3.0" xmlns="{NS1}"/>', r"not XLIFF 1.2 or 2.x"),
    ],
)
def test_unsafe_and_malformed_files_are_a_400_naming_the_place(document: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_xliff(document)
    assert caught.value.status == 400 and caught.value.field == "document"
    assert re.search(message, caught.value.message), caught.value.message
