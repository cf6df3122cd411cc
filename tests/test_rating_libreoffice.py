"""A sheet opened and re-saved by a real spreadsheet (LibreOffice, headless) still imports, and
LibreOffice never turns a neutralized model output into a formula."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import require_tool
from evalkit.rating import export_sheets, import_sheets
from evalkit.rating.aggregate import ratings_frame
from test_rating import fill, make_run, true_score  # tests/ is on sys.path (rootdir conftest, no __init__)



@pytest.fixture(scope="module", autouse=True)
def soffice_exe() -> str:
    """LibreOffice (apt-get install -y --no-install-recommends libreoffice-calc-nogui): a failure under CI=true."""
    return require_tool("soffice", why="re-saves rating sheets")
# Field separator 44 (,), text delimiter 34 ("), charset 76 (UTF-8), start at line 1.
CSV_UTF8 = "44,34,76,1"
CSV_EXPORT = f"csv:Text - txt - csv (StarCalc):{CSV_UTF8}"


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A private profile: no clash with a desktop LibreOffice or a parallel test run.
    return tmp_path_factory.mktemp("lo-profile")


def soffice(profile: Path, src: Path, target: str, outdir: Path, infilter: str | None = None) -> Path:
    """Open `src` in LibreOffice and save it as `target` into `outdir` (what a rater's "Save as" does)."""
    cmd = [require_tool("soffice"), f"-env:UserInstallation={profile.as_uri()}", "--headless", "--norestore"]
    cmd += [f"--infilter={infilter}"] if infilter else []
    cmd += ["--convert-to", target, "--outdir", str(outdir), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    out = outdir / f"{src.stem}.{target.split(':')[0]}"
    assert proc.returncode == 0 and out.exists(), f"soffice failed: {proc.stdout}{proc.stderr}"
    return out


def imported(run: Path, sheet: Path) -> list[tuple[str, str, int]]:
    for old in (run / "ratings" / "imported").glob("*.json"):
        old.unlink()
    import_sheets(run, [sheet])
    f = ratings_frame(run)
    return sorted(zip(f["item_id"], f["deployment"], f["score"].astype(int)))


@pytest.fixture()
def filled_csv(tmp_path: Path) -> tuple[Path, Path, list[tuple[str, str, int]]]:
    run = make_run(tmp_path / "run")
    (sheet,) = export_sheets(run, raters=1)
    filled = fill(run, sheet, tmp_path / "filled.csv")
    return run, filled, imported(run, filled)


def test_csv_resaved_as_utf8_csv_imports(filled_csv, profile: Path, tmp_path: Path) -> None:
    run, filled, expected = filled_csv
    resaved = soffice(profile, filled, CSV_EXPORT, tmp_path / "lo", infilter=f"CSV:{CSV_UTF8}")
    assert resaved.read_bytes() != filled.read_bytes()  # LibreOffice really rewrote it (no BOM, other quoting)
    assert imported(run, resaved) == expected


def test_csv_read_in_the_wrong_charset_still_imports(filled_csv, profile: Path, tmp_path: Path) -> None:
    """Without an explicit charset LibreOffice may decode UTF-8 as Latin-1 (BOM kept as 'ï»¿'):
    the text columns turn to mojibake but ids and scores survive, and the header is still found."""
    run, filled, expected = filled_csv
    resaved = soffice(profile, filled, CSV_EXPORT, tmp_path / "lo")
    assert imported(run, resaved) == expected


def test_csv_to_xlsx_and_back_imports_and_never_makes_a_formula(filled_csv, profile: Path, tmp_path: Path) -> None:
    from openpyxl import load_workbook

    run, filled, expected = filled_csv
    xlsx = soffice(profile, filled, "xlsx", tmp_path / "x", infilter=f"CSV:{CSV_UTF8}")
    cells = [c for row in load_workbook(xlsx).active.iter_rows() for c in row]
    assert not [c.coordinate for c in cells if c.data_type == "f"]
    assert "'=cmd|' /C calc'!A0" in {c.value for c in cells}
    assert imported(run, xlsx) == expected
    back = soffice(profile, xlsx, CSV_EXPORT, tmp_path / "back")
    assert imported(run, back) == expected


def test_exported_xlsx_resaved_imports(profile: Path, tmp_path: Path) -> None:
    from openpyxl import load_workbook

    run = make_run(tmp_path / "run")
    (sheet,) = export_sheets(run, raters=1, fmt="xlsx")
    wb = load_workbook(sheet)
    ws = wb.active
    h = [c.value for c in ws[1]]
    entry = json.loads((run / "ratings" / "key.json").read_text(encoding="utf-8"))["sheets"][ws.cell(2, 1).value]
    for row in ws.iter_rows(min_row=2):
        planned = entry["rows"][row[h.index("row_id")].value]
        row[h.index("score")].value = true_score(1, planned["item_id"], planned["deployment"])
    wb.save(tmp_path / "filled.xlsx")
    expected = imported(run, tmp_path / "filled.xlsx")
    resaved = soffice(profile, tmp_path / "filled.xlsx", "xlsx", tmp_path / "lo")
    cells = [c for row in load_workbook(resaved).active.iter_rows() for c in row]
    assert not [c.coordinate for c in cells if c.data_type == "f"]
    assert imported(run, resaved) == expected


def test_control_an_unneutralized_cell_does_become_a_formula(profile: Path, tmp_path: Path) -> None:
    """Proves the formula checks above can fail: LibreOffice evaluates a quoted "=1+1" from a CSV."""
    from openpyxl import load_workbook

    src = tmp_path / "control.csv"
    src.write_text('"raw","neutralized"\r\n"=1+1","\'=1+1"\r\n', encoding="utf-8")
    ws = load_workbook(soffice(profile, src, "xlsx", tmp_path / "x", infilter=f"CSV:{CSV_UTF8}")).active
    raw, neutralized = ws["A2"], ws["B2"]
    assert raw.data_type == "f" and raw.value == "=1+1"
    assert neutralized.data_type == "s" and neutralized.value == "'=1+1"
