"""Helpers of the tool script tests."""

from __future__ import annotations

import re
from pathlib import Path

import ollie

DEFAULTS = Path(ollie.__file__).parent / "defaults" / "tools"


def shared_block(name: str, title: str) -> str:
    """The block `# ---- {title}` … `# ---- end of the {title}` of a default script: scripts that
    stand alone carry copies of the same code, which must not drift apart."""
    text = (DEFAULTS / name).read_text()
    found = re.search(rf"^# ---- {title}.*?^# ---- end of the {title}", text, re.S | re.M)
    assert found, (name, title)
    return re.sub(r"^# ---- .*\n", "", found.group(0), count=1, flags=re.M)
