"""Every argparse and jsonargparse internal the ``fastdata`` LightningCLI reads, in one place.

- ``argparse.ArgumentParser._actions`` (each action's ``option_strings`` and a subcommand action's ``choices``): the
  option keys a parser and its subcommands know, to suggest the closest one for a key it did not know
  (:func:`parser_keys`);
- jsonargparse's error texts (``class_path '...' ... Option '...' is not accepted``, ``option '...'``,
  ``Key "..." is not expected``, ``unrecognized arguments: --...``): read to say which key was wrong in one line
  (:func:`short_error`); a text of another shape is shown as its first line, unchanged in meaning.

``tests/test_cli.py`` pins both on the installed jsonargparse (a typo in a config and on the command line).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
from typing import Any

__all__ = ["parser_keys", "short_error"]


def _parameters(class_path: str) -> list[str]:
    """The ``__init__`` argument names of ``class_path``, and of its bases while an ``__init__`` passes ``**kwargs`` up.

    A module that names every argument it takes (``SegmentationDataModule``) stops there: its base's others are not
    its arguments.
    """
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return []
    names: list[str] = []
    for klass in getattr(cls, "__mro__", [cls]):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters.values()
        names += [p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self"]
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            break
    return list(dict.fromkeys(names))


def parser_keys(parser: Any) -> list[str]:
    """Every option key the parser and its subcommands know (``trainer.max_epochs``, ``data.init_args.root``)."""
    keys: list[str] = []
    stack = [parser]
    while stack:
        current = stack.pop()
        for action in getattr(current, "_actions", []):
            keys += [s.lstrip("-") for s in getattr(action, "option_strings", []) if s.startswith("--")]
            for sub in (getattr(action, "choices", None) or {}).values() if isinstance(action.choices, dict) else []:
                stack.append(sub)
    return list(dict.fromkeys(keys))


def short_error(text: str, parser: Any) -> str:
    """Jsonargparse's error as one line, with the closest valid names for a key it did not know."""
    message = text[text.index("error:") :].strip()
    if found := re.search(r"class_path '([\w.]+)'.*?Option '(\w+)' is not accepted", message, re.S):
        class_path, key = found.groups()
        close = difflib.get_close_matches(key, _parameters(class_path), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        return (
            f"error: {key!r} is not an argument of {class_path}{hint} (`fastdata fit --help` lists the options; "
            f"`--print_config` shows a whole config)"
        )
    if found := re.search(
        r"option '([\w.]+)'|Key \"([\w.]+)\" is not expected|unrecognized arguments: --([\w.]+)", message
    ):
        key = next(g for g in found.groups() if g)
        close = difflib.get_close_matches(key, parser_keys(parser), n=3, cutoff=0.75)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        return f"error: {key!r} is not an option of this command{hint} (`fastdata fit --help` lists them)"
    return message.splitlines()[0] + (" ..." if "\n" in message else "")
