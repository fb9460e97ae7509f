"""docs/bad-inputs.md and the tests that pin it list the same rows, with the same exit status."""

import re

from tests.conftest import ROOT
from tests.infra.test_bad_inputs import ROWS as STACK_ROWS
from tests.jobs.test_bad_inputs import ROWS as JOB_ROWS
from tests.trainer.test_bad_inputs import ROWS as TRAINER_ROWS


def documented_rows() -> dict[str, int]:
    """Row name -> exit status, from every table line of the page."""
    rows = {}
    for line in (ROOT / "docs" / "bad-inputs.md").read_text().splitlines():
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 6 and re.fullmatch(r"`[a-z0-9-]+`", cells[1]):
            rows[cells[1].strip("`")] = int(cells[4])
    return rows


def test_the_page_lists_every_tested_row_with_its_exit_status():
    tested = {
        name: row.exit_status for rows in (STACK_ROWS, TRAINER_ROWS, JOB_ROWS) for name, row in rows.items()
    }
    assert documented_rows() == tested


def test_readme_links_the_catalogue():
    assert "(docs/bad-inputs.md)" in (ROOT / "README.md").read_text()
