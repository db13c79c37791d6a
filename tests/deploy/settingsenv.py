"""The TANGRAM_* variables the services' settings read, found in their source."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# Services that read their settings in their entry module rather than a settings.py.
MODULES = {
    "authcallout": ROOT / "services/authcallout/__main__.py",
    "admission": ROOT / "services/admission/__main__.py",
}


def settings_env_vars() -> set[str]:
    """Every TANGRAM_* variable the services' settings modules read."""
    sources = [
        ROOT / "libs/tangram/service/settings.py",
        *ROOT.glob("services/*/settings.py"),
        *MODULES.values(),
    ]
    names: set[str] = set()
    for source in sources:
        text = source.read_text()
        names |= set(re.findall(r"\b(?:env|env_flag)\(\s*\"(TANGRAM_[A-Z_]+)\"", text))
        names |= {f"TANGRAM_{n}" for n in re.findall(r"\b_env\(\s*\"([A-Z_]+)\"", text)}
    return names
