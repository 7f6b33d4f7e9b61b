"""Generates the README's rule table and one doc page per rule (docs/rules/CODE.md) from the
rules themselves, so docs are written once, in the rule's module.

    python -m matlint.docs          # rewrite README table and docs/rules/
    python -m matlint.docs --check  # exit 1 if they are out of date
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .registry import all_rules

START = "<!-- rules-table:start -->"
END = "<!-- rules-table:end -->"


def rules_table() -> str:
    rows = ["| code | name | family | severity | default | fix | what it finds |",
            "|---|---|---|---|---|---|---|"]
    for rule in all_rules():
        default = "on" if rule.default_enabled else "off"
        summary = rule.summary.replace("|", "\\|")
        rows.append(f"| [{rule.code}](docs/rules/{rule.code}.md) | `{rule.name}` | {rule.family()} | "
                    f"{rule.level()} | {default} | {rule.fix_kind()} | {summary} |")
    return "\n".join(rows)


def rule_pages() -> dict:
    return {f"{rule.code}.md": rule.rendered_docs() for rule in all_rules()}


def render_readme(readme: str) -> str:
    if START not in readme or END not in readme:
        raise ValueError(f"README lacks the {START} / {END} markers")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{rules_table()}\n{END}{tail}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m matlint.docs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root")
    parser.add_argument("--check", action="store_true", help="only check that the generated docs are current")
    args = parser.parse_args(argv)
    readme_path = args.root / "README.md"
    pages_dir = args.root / "docs" / "rules"
    readme = readme_path.read_text(encoding="utf-8")
    wanted_readme = render_readme(readme)
    pages = rule_pages()
    stale = []
    if wanted_readme != readme:
        stale.append(str(readme_path))
    existing = {p.name for p in pages_dir.glob("*.md")} if pages_dir.exists() else set()
    for name, text in pages.items():
        path = pages_dir / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(str(path))
    stale += [str(pages_dir / n) for n in sorted(existing - set(pages))]
    if args.check:
        if stale:
            print("out of date (run `python -m matlint.docs`):\n  " + "\n  ".join(stale))
            return 1
        return 0
    readme_path.write_text(wanted_readme, encoding="utf-8")
    pages_dir.mkdir(parents=True, exist_ok=True)
    for name, text in pages.items():
        (pages_dir / name).write_text(text, encoding="utf-8")
    for name in existing - set(pages):
        (pages_dir / name).unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
