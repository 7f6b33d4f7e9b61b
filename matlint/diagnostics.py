"""Findings, fixes and edits: the one data shape every surface (CLI, flake8, server, guard) speaks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

DOCS_BASE_URL = "https://github.com/matlint/matlint/blob/main/docs/rules/"


def rule_url(code: str) -> str:
    return f"{DOCS_BASE_URL}{code}.md"


@dataclass(frozen=True)
class Edit:
    """Replace the text between (row, column) and (end_row, end_column) by `content`.

    Rows are 1-based; columns are 1-based and count characters (code points), as ruff does.
    """

    content: str
    row: int
    column: int
    end_row: int
    end_column: int

    def to_json(self) -> dict:
        return {
            "content": self.content,
            "location": {"row": self.row, "column": self.column},
            "end_location": {"row": self.end_row, "column": self.end_column},
        }

    @classmethod
    def from_json(cls, data: dict) -> "Edit":
        return cls(
            data["content"],
            data["location"]["row"],
            data["location"]["column"],
            data["end_location"]["row"],
            data["end_location"]["column"],
        )


@dataclass(frozen=True)
class Fix:
    message: str
    edits: tuple
    safe: bool = True

    @property
    def applicability(self) -> str:
        return "safe" if self.safe else "unsafe"

    def to_json(self) -> dict:
        return {
            "applicability": self.applicability,
            "message": self.message,
            "edits": [e.to_json() for e in self.edits],
        }

    @classmethod
    def from_json(cls, data: dict) -> "Fix":
        return cls(
            data["message"],
            tuple(Edit.from_json(e) for e in data["edits"]),
            data["applicability"] == "safe",
        )


@dataclass
class Finding:
    code: str
    message: str
    filename: str
    row: int
    column: int
    end_row: int
    end_column: int
    fix: Optional[Fix] = None
    # The line a `# noqa` for this finding goes on (where the editor's action writes it): the
    # first line of the statement it stands for, or `row`; one on `row` silences it as well.
    noqa_row: Optional[int] = None
    evidence: Optional[dict] = None
    estimated_savings_ms: Optional[float] = None
    extra: dict = field(default_factory=dict)
    # The notebook cell (1-based, counting every cell) that row and column are in; None in a .py file.
    cell: Optional[int] = None

    @property
    def url(self) -> str:
        return rule_url(self.code)

    def sort_key(self):
        return (self.filename, self.cell or 0, self.row, self.column, self.code)

    @property
    def location(self) -> str:
        """`path:row:col`, or `path:cell N:row:col` in a notebook (as ruff writes them)."""
        cell = f"cell {self.cell}:" if self.cell is not None else ""
        return f"{self.filename}:{cell}{self.row}:{self.column}"

    def to_json(self) -> dict:
        data: dict[str, Any] = {
            "code": self.code,
            "message": self.message,
            "filename": self.filename,
            "location": {"row": self.row, "column": self.column},
            "end_location": {"row": self.end_row, "column": self.end_column},
            "fix": self.fix.to_json() if self.fix else None,
            "url": self.url,
            "noqa_row": self.noqa_row,
            "cell": self.cell,
        }
        if self.evidence is not None:
            data["evidence"] = self.evidence
        if self.estimated_savings_ms is not None:
            data["estimated_savings_ms"] = self.estimated_savings_ms
        return data

    @classmethod
    def from_json(cls, data: dict) -> "Finding":
        return cls(
            code=data["code"],
            message=data["message"],
            filename=data["filename"],
            row=data["location"]["row"],
            column=data["location"]["column"],
            end_row=data["end_location"]["row"],
            end_column=data["end_location"]["column"],
            fix=Fix.from_json(data["fix"]) if data.get("fix") else None,
            noqa_row=data.get("noqa_row"),
            evidence=data.get("evidence"),
            estimated_savings_ms=data.get("estimated_savings_ms"),
            cell=data.get("cell"),
        )
