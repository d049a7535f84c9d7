"""Inline codes read back from a translation (:class:`Codes`): what a model or a cut between
segments can leave (a lost code, a repeat, a stray or missing close, an unknown number) still
gives every code once, well nested. The pipeline's own repair leaves none of these, so they are
tested here on their own."""

from __future__ import annotations

from hymt_serve.request.localisation import Codes


def test_codes_render_puts_back_what_a_translation_lost_once_and_well_nested() -> None:
    codes = Codes("c")
    bold_open, bold_close = codes.pair("<g id='1'>", "</g>")
    image = codes.standalone("<x id='2'/>")
    link_open, link_close = codes.pair(
        "<bpt id='3'>&lt;a&gt;</bpt>", "<ept id='3'>&lt;/a&gt;</ept>"
    )
    assert bold_open == '<c n="1">' and bold_close == "</c>" and image == '<c n="2"/>'

    def render(translated: str) -> str:
        return codes.render(translated, lambda text: text.replace("&", "&amp;"))

    # every code where the translation put it
    assert render(f"{bold_open}a{image}{bold_close} & {link_open}b{link_close}") == (
        "<g id='1'>a<x id='2'/></g> &amp; <bpt id='3'>&lt;a&gt;</bpt>b<ept id='3'>&lt;/a&gt;</ept>"
    )
    # lost: at the end, a pair around nothing; repeated: once; a stray close: dropped;
    # a pair left open: closed at the end; a number no code has: dropped
    assert render(f'x{image}{image}</c> <c n="9"/>{link_open}y') == (
        "x<x id='2'/> <bpt id='3'>&lt;a&gt;</bpt>y<ept id='3'>&lt;/a&gt;</ept><g id='1'></g>"
    )
