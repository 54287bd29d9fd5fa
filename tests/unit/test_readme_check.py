"""The README's `check` example is what `check` prints today: a fresh run against the simulator has the same
lines, in the same order, numbers aside (to bring the README up to date: .venv/bin/python -m devtools.readme_check)."""

from __future__ import annotations

from devtools.readme_check import README, check_output, readme_block, shape


def test_the_readme_shows_what_check_prints() -> None:
    text = README.read_text(encoding="utf-8")
    start, end = readme_block(text)
    shown, ran = shape(text[start:end]), shape(check_output("3s"))
    assert shown == ran, ("the README's check example is out of date: run .venv/bin/python -m devtools.readme_check"
                          "\nREADME:\n" + "\n".join(shown) + "\nrun:\n" + "\n".join(ran))
