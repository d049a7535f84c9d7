"""PPTX and XLSX through the document path, files built with python-pptx and openpyxl in many
scripts: slides, text boxes, tables, notes and a chart title (PPTX), cell strings (XLSX, inline
as openpyxl writes them; formulas, numbers and dates untouched) come back with every other
member byte for byte and the rewritten parts equal as XML outside the text of their runs."""

from __future__ import annotations

import datetime
import io
import random

import openpyxl
import pptx
from localisation_files import mark_words
from office_files import members, sentence, texts, translate_office, without_text
from openpyxl.styles import Font
from pptx.chart.data import CategoryChartData
from pptx.enum.chart import XL_CHART_TYPE
from pptx.util import Inches
from test_document_fidelity import careless


def build_pptx(slides: int = 4) -> bytes:
    deck = pptx.Presentation()
    for index in range(slides):
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        slide.shapes.title.text = sentence(index, 3)
        body = slide.placeholders[1].text_frame
        body.text = sentence(index + 1)
        paragraph = body.add_paragraph()
        paragraph.add_run().text = sentence(index + 2, 2) + " "
        bold = paragraph.add_run()
        bold.text = sentence(index + 3, 2)
        bold.font.bold = True
        bold.hyperlink.address = f"https://example.org/{index}"
        box = slide.shapes.add_textbox(Inches(1), Inches(5), Inches(4), Inches(1))
        box.text_frame.text = sentence(index + 4, 4)
        table = slide.shapes.add_table(2, 2, Inches(5), Inches(5), Inches(4), Inches(1)).table
        for number, cell in enumerate(c for row in table.rows for c in row.cells):
            cell.text = sentence(index + number, 2)
        slide.notes_slide.notes_text_frame.text = sentence(index + 5, 5)
    chart_data = CategoryChartData()
    chart_data.categories = ["a", "b"]
    chart_data.add_series("s", (1.0, 2.0))
    chart = (
        deck.slides[0]
        .shapes.add_chart(
            XL_CHART_TYPE.COLUMN_CLUSTERED, Inches(1), Inches(1), Inches(4), Inches(3), chart_data
        )
        .chart
    )
    chart.has_title = True
    chart.chart_title.text_frame.text = sentence(40, 3)
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def build_xlsx() -> bytes:
    book = openpyxl.Workbook()
    sheet = book.active
    for row in range(1, 8):
        sheet.cell(row, 1, sentence(row, 3))
        sheet.cell(row, 2, row * 1.5)
        sheet.cell(row, 3, datetime.date(2026, 1, row))
        sheet.cell(row, 4, f"=B{row}*2")
    sheet["A1"].font = Font(bold=True)
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def _check(source: bytes, kind: str, allowed: tuple[str, ...]) -> bytes:
    result = translate_office(source, kind, mark_words)
    before, after = members(source), members(result)
    assert list(before) == list(after)
    rewritten = [name for name in before if before[name] != after[name]]
    assert rewritten and all(name.startswith(allowed) for name in rewritten), rewritten
    for name in rewritten:
        assert without_text(before[name]) == without_text(after[name]), name
        assert texts(after[name]) == [mark_words(text) for text in texts(before[name])], name
    assert members(translate_office(source, kind, lambda text: text)) == before
    return result


def test_pptx_slides_notes_tables_and_chart_titles_change_only_in_their_text() -> None:
    result = _check(
        build_pptx(), "pptx", ("ppt/slides/slide", "ppt/notesSlides/", "ppt/charts/chart")
    )
    deck = pptx.Presentation(io.BytesIO(result))
    slide = deck.slides[1]
    assert slide.shapes.title.text.startswith("«")
    assert slide.notes_slide.notes_text_frame.text.startswith("«")
    runs = [r for p in slide.placeholders[1].text_frame.paragraphs for r in p.runs]
    linked = [r for r in runs if r.hyperlink.address]
    assert [r.hyperlink.address for r in linked] == ["https://example.org/1"]
    assert linked[0].font.bold and linked[0].text.startswith("«")


def test_pptx_with_a_careless_translator_keeps_every_link() -> None:
    for seed in range(4):
        result = translate_office(build_pptx(2), "pptx", careless(random.Random(seed)))
        deck = pptx.Presentation(io.BytesIO(result))
        for index, slide in enumerate(deck.slides):
            runs = [r for p in slide.placeholders[1].text_frame.paragraphs for r in p.runs]
            assert [r.hyperlink.address for r in runs if r.hyperlink.address] == [
                f"https://example.org/{index}"
            ]


def test_xlsx_cell_strings_change_and_numbers_dates_formulas_do_not() -> None:
    source = build_xlsx()
    # openpyxl writes cell strings inline (<is>); Excel writes them shared: both are read
    result = _check(source, "xlsx", ("xl/sharedStrings.xml", "xl/worksheets/"))
    sheet = openpyxl.load_workbook(io.BytesIO(result)).active
    for row in range(1, 8):
        assert sheet.cell(row, 1).value == mark_words(sentence(row, 3))
        assert sheet.cell(row, 2).value == row * 1.5
        assert sheet.cell(row, 3).value == datetime.datetime(2026, 1, row)
        assert sheet.cell(row, 4).value == f"=B{row}*2"
    assert sheet["A1"].font.bold
