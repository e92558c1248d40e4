"""Errors shared by the validators (catalog, config, web config): every problem found, reported at once."""

from __future__ import annotations


class ProblemsError(ValueError):
    """Every problem found in one input, one per line (file:line: key.path: what is wrong)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems
