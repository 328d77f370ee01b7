"""The checkpoint validator's findings: one structured report shared by every rule.

Rules never raise on a bad draft; they add a finding with a stable ``code`` so one run
lists every defect at once, and tests and the validate stage can match codes instead
of message text.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

ERROR = "error"
WARNING = "warning"
INFO = "info"


@dataclass
class Finding:
    """One line of the report: ``level``, a stable ``code`` and the file/field/tensor."""

    level: str  # error | warning | info
    code: str
    where: str
    message: str

    def line(self) -> str:
        return f"{self.level.upper():7} [{self.code}] {self.where}: {self.message}"


@dataclass
class Report:
    """Structured findings; ``ok`` means no errors (warnings do not fail a draft).

    ``facts`` carries what one group of rules learnt for a later group (aux ids,
    speculative tokens, verifier name), so rules stay independent functions.
    """

    draft_dir: str
    findings: list[Finding] = field(default_factory=list)
    serve_command: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)

    def add(self, level: str, code: str, where: str, message: str) -> None:
        self.findings.append(Finding(level, code, where, message))

    def error(self, code: str, where: str, message: str) -> None:
        self.add(ERROR, code, where, message)

    def warning(self, code: str, where: str, message: str) -> None:
        self.add(WARNING, code, where, message)

    def info(self, code: str, where: str, message: str) -> None:
        self.add(INFO, code, where, message)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == WARNING]

    @property
    def infos(self) -> list[Finding]:
        return [f for f in self.findings if f.level == INFO]

    @property
    def ok(self) -> bool:
        return not self.errors

    def codes(self, level: str | None = None) -> set[str]:
        return {f.code for f in self.findings if level is None or f.level == level}

    def to_dict(self) -> dict[str, Any]:
        return {
            "draft_dir": self.draft_dir,
            "ok": self.ok,
            "errors": [asdict(f) for f in self.errors],
            "warnings": [asdict(f) for f in self.warnings],
            "info": [asdict(f) for f in self.infos],
            "serve_command": self.serve_command,
            "facts": self.facts,
        }

    def format(self) -> str:
        verdict = "PASS" if self.ok else "FAIL"
        head = (
            f"{verdict}: {self.draft_dir} -- {len(self.errors)} error(s), "
            f"{len(self.warnings)} warning(s)"
        )
        order = {ERROR: 0, WARNING: 1, INFO: 2}
        lines = [f.line() for f in sorted(self.findings, key=lambda f: order[f.level])]
        if self.serve_command:
            lines.append(f"serve with: {self.serve_command}")
        return "\n".join([head, *lines])
