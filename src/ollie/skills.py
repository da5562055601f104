"""Skills: `SKILL.md` files with `name:` / `description:` front matter under OLLIE_SKILLS_PATH."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import config


@dataclass(frozen=True, slots=True)
class Skill:
    name: str
    description: str
    path: Path


def _front_matter(text: str) -> dict[str, str]:
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}
    fields = {}
    for line in lines[1:]:
        if line.strip() == "---":
            break
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip().strip("'\"")
    return fields


def list_skills() -> list[Skill]:
    """Every skill once (the first on the path wins), sorted by name."""
    found: dict[str, Skill] = {}
    for root in config.skills_path():
        for path in sorted(root.glob("**/SKILL.md")) if root.is_dir() else ():
            try:
                meta = _front_matter(path.read_text())
            except OSError:
                continue
            name = meta.get("name") or path.parent.name
            found.setdefault(name, Skill(name, meta.get("description", ""), path))
    return sorted(found.values(), key=lambda s: s.name)
