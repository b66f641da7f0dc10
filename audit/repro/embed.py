"""Copy live audit objects into a standalone script as source code.

A reproduction script (audit.repro.scripts) must run with torch alone (and, for an hf: variant,
transformers, whose code it is), yet compute exactly
what the audit computed: the same input builder, the same variant, the same metric
code. Rather than keeping hand-written copies in step, `Embedder` starts from the
objects themselves (a scenario's draw function, a variant's built callable, a metric)
and writes the source of each, plus everything it refers to:

- functions and classes of the `audit` package: their source (`inspect.getsource`),
  after the names their code loads; closures become a small factory that binds the
  captured values, so `_scaled(64)` is copied as `alpha = 64` plus its inner `draw`;
- functools.partial objects: `functools.partial(func, *args)`, func and args copied;
- literals (numbers, strings, tuples/lists/dicts of them), torch and standard-library
  modules, functions, classes and enum members: an import and a dotted name, checked
  to give back the very same object.

Anything else (a lambda, a relative import inside a function, an object of unknown
kind) raises NotSelfContained naming it: the caller records why there is no script
instead of writing one that computes something else.
"""
from __future__ import annotations

import builtins
import dataclasses
import dis
import functools
import importlib
import inspect
import math
import re
import sys
import textwrap
from pathlib import PurePath
from typing import Any, Iterator

_FUTURE_FLAGS = __import__("__future__").annotations.compiler_flag
_RELATIVE_IMPORT = re.compile(r"^\s*from\s+\.|^\s*import\s+\.", re.MULTILINE)
_LITERAL_TYPES = (type(None), bool, int, str, bytes)


def _without_decorators(src: str) -> str:
    """A function's source from its `def` line: where the live function is the one its source
    defines (a decorator that registers it, as workload.mistakes' @mistake, and returns it
    unchanged), the decorator lines would only re-run the registration, which can refer back
    to the function being copied."""
    import ast
    tree = ast.parse(src)
    node = tree.body[0] if tree.body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.decorator_list:
        return src
    return "\n".join(src.splitlines()[node.lineno - 1:]) + "\n"


@functools.lru_cache(maxsize=None)
def _source(target: Any, strip_decorators: bool) -> tuple[str, tuple[str, ...]]:
    """(source, the global names its code loads) of an audit function or class, once per process:
    a report writes many scripts that copy the same functions (getsource and compile were most of
    its scripts' time). Raises OSError or TypeError where there is no source."""
    src = textwrap.dedent(inspect.getsource(target))   # decorators included
    if strip_decorators:
        src = _without_decorators(src)
    code = compile(src, inspect.getsourcefile(target) or "<audit>", "exec", flags=_FUTURE_FLAGS,
                   dont_inherit=True)
    return src, tuple(dict.fromkeys(_loaded_names(code)))


class NotSelfContained(Exception):
    """An object cannot be copied into a standalone script (the message says which and why)."""


def _is_ours(obj: Any) -> bool:
    module = getattr(obj, "__module__", None) or ""
    return module == "audit" or module.startswith("audit.")


def _external_root(module_name: str, libraries: tuple[str, ...] = ()) -> bool:
    """Modules a script may import: torch, the standard library, and the libraries the variant
    under test is made of (transformers, for an hf: variant)."""
    root = module_name.split(".")[0]
    return root == "torch" or root in sys.stdlib_module_names or root in libraries


def _loaded_names(code: Any) -> Iterator[str]:
    """Names a code object and the code nested in it load as globals (or module-level names)."""
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            yield ins.argval
    for const in code.co_consts:
        if inspect.iscode(const):
            yield from _loaded_names(const)


def _literal(obj: Any) -> str | None:
    """Source of a plain literal that evaluates back to an equal object, or None."""
    if isinstance(obj, float):
        return repr(obj) if math.isfinite(obj) else f"float({str(obj)!r})"
    if isinstance(obj, _LITERAL_TYPES):
        return repr(obj)
    if isinstance(obj, (tuple, list)):
        parts = [_literal(x) for x in obj]
        if any(p is None for p in parts):
            return None
        body = ", ".join(parts) + ("," if isinstance(obj, tuple) and len(parts) == 1 else "")
        return f"({body})" if isinstance(obj, tuple) else f"[{body}]"
    if isinstance(obj, dict):
        items = [(_literal(k), _literal(v)) for k, v in obj.items()]
        if any(k is None or v is None for k, v in items):
            return None
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    return None


_SCRIPT_OWN = object()   # what a reserved name is bound to (Embedder.reserve)


class Embedder:
    """Collects the source that binds chosen names to copies of live objects."""

    def __init__(self, libraries: tuple[str, ...] = ()) -> None:
        self.libraries = libraries                 # importable besides torch and the standard library
        self.imports: dict[str, None] = {}        # import statements, in first-use order
        self._chunks: list[str] = []               # definitions, dependencies first
        self._bound: dict[str, Any] = {}           # script-level name -> the object it copies
        self._names_of: dict[int, str] = {}        # id(object) -> its script-level name
        self._in_progress: set[int] = set()

    # ------------------------------------------------------------------ public
    def reserve(self, *names: str) -> None:
        """Keep names the script defines itself (its constants): copied code that needs one of
        them raises NotSelfContained instead of silently replacing the script's value."""
        for name in names:
            self._claim(name, _SCRIPT_OWN)

    def bind(self, name: str, obj: Any) -> str:
        """Make `name` a script-level name for a copy of `obj`; return the name."""
        if name in self._bound:
            if self._bound[name] is obj:
                return name
            raise NotSelfContained(f"two different objects are both called {name!r}")
        expr = self.expr(obj, hint=name)
        if expr != name:
            self._claim(name, obj)
            self._chunks.append(f"{name} = {expr}\n")
        return name

    def try_expr(self, obj: Any, hint: str) -> str | None:
        """expr(obj), or None (and nothing added) when obj cannot be copied."""
        state = (dict(self.imports), list(self._chunks), dict(self._bound), dict(self._names_of))
        try:
            return self.expr(obj, hint)
        except NotSelfContained:
            self.imports, chunks, self._bound, self._names_of = state
            self._chunks[:] = chunks
            return None

    def assign(self, name: str, source_expr: str) -> str:
        """Bind `name` to the value of a source expression over names already bound."""
        self._claim(name, source_expr)
        self._chunks.append(f"{name} = {source_expr}\n")
        return name

    def bound(self, name: str) -> bool:
        return name in self._bound

    def mark(self) -> int:
        """A position in the definitions, for section()."""
        return len(self._chunks)

    def section(self, start: int = 0, end: int | None = None) -> str:
        """The definitions added between two marks, dependencies first."""
        return "\n\n\n".join(chunk.rstrip("\n") for chunk in self._chunks[start:end])

    def chunks(self) -> list[str]:
        """Every definition added so far, each a whole top-level statement (or several)."""
        return list(self._chunks)

    def import_lines(self) -> list[str]:
        return list(self.imports)

    # ------------------------------------------------------------------ expressions
    def expr(self, obj: Any, hint: str) -> str:
        """A source expression that gives (a copy of) `obj` in the script."""
        literal = _literal(obj)
        if literal is not None:
            return literal
        if id(obj) in self._names_of and self._bound.get(self._names_of[id(obj)]) is obj:
            return self._names_of[id(obj)]
        if isinstance(obj, functools.partial):
            self.imports["import functools"] = None
            args = [self.expr(obj.func, hint=getattr(obj.func, "__name__", hint))]
            args += [self.expr(a, hint=hint) for a in obj.args]
            args += [f"{k}={self.expr(v, hint=k)}" for k, v in obj.keywords.items()]
            return f"functools.partial({', '.join(args)})"
        if inspect.ismodule(obj):
            return self._module(obj)
        if isinstance(obj, PurePath):
            self.imports["import pathlib"] = None
            return f"pathlib.Path({str(obj)!r})"
        if _is_ours(obj) and (inspect.isfunction(inspect.unwrap(obj)) or inspect.isclass(obj)):
            return self._copy_source(obj, hint)
        if _is_ours(type(obj)) and dataclasses.is_dataclass(obj) and not inspect.isclass(obj):
            cls = self.expr(type(obj), hint=type(obj).__name__)
            args = ", ".join(f"{f.name}={self.expr(getattr(obj, f.name), hint=f.name)}"
                             for f in dataclasses.fields(obj) if f.init)
            return f"{cls}({args})"
        if isinstance(obj, (tuple, list)):
            body = ", ".join(self.expr(x, hint) for x in obj)
            body += "," if isinstance(obj, tuple) and len(obj) == 1 else ""
            return f"({body})" if isinstance(obj, tuple) else f"[{body}]"
        if isinstance(obj, dict):
            return "{" + ", ".join(f"{self.expr(k, hint)}: {self.expr(v, hint)}" for k, v in obj.items()) + "}"
        imported = self._importable(obj)
        if imported is not None:
            return imported
        what = f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', '?')}" \
            if callable(obj) else f"a {type(obj).__module__}.{type(obj).__qualname__}"
        raise NotSelfContained(f"{hint}: cannot copy {what} into a standalone script (only the audit's "
                               f"own code, torch and the standard library can be)")

    def _module(self, module: Any) -> str:
        if not _external_root(module.__name__, self.libraries):
            raise NotSelfContained(f"module {module.__name__} is neither torch nor the standard library")
        self.imports[f"import {module.__name__}"] = None
        return module.__name__

    def _importable(self, obj: Any) -> str | None:
        """`module.qualname` (or `module.Enum.member`) of a torch or standard-library object."""
        candidates = []
        module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if isinstance(module, str) and isinstance(qualname, str):
            candidates.append((module, qualname))
        kind, name = type(obj), getattr(obj, "name", None)
        if isinstance(name, str):            # an enum member: under whichever name its module exports the enum
            exported = [kind.__qualname__]
            home = sys.modules.get(kind.__module__)
            if home is not None:
                exported += [n for n, v in vars(home).items() if v is kind and n != kind.__qualname__]
            candidates += [(kind.__module__, f"{n}.{name}") for n in exported]
        for module, qualname in candidates:
            if "<" in qualname or not _external_root(module, self.libraries):
                continue
            path = f"{module}.{qualname}"
            try:
                importlib.import_module(module)
                root = module.split(".")[0]
                value = eval(path, {root: importlib.import_module(root)})  # noqa: S307 - our own dotted path
            except Exception:  # noqa: BLE001 - not importable this way: try the next candidate
                continue
            if value is obj or (isinstance(name, str) and type(value) is kind and value == obj):
                self.imports[f"import {module}"] = None
                return path
        return None

    # ------------------------------------------------------------------ audit source
    def _claim(self, name: str, obj: Any) -> None:
        if name in self._bound and self._bound[name] is not obj:
            raise NotSelfContained(f"two different objects are both called {name!r}")
        self._bound[name] = obj
        self._names_of.setdefault(id(obj), name)

    def _unique(self, hint: str, obj: Any) -> str:
        name, n = hint, 2
        while name in self._bound and self._bound[name] is not obj:
            name, n = f"{hint}_{n}", n + 1
        return name

    def _copy_source(self, obj: Any, hint: str) -> str:
        """Copy an audit function or class: its dependencies first, then its own source."""
        target = inspect.unwrap(obj) if not inspect.isclass(obj) else obj
        qual = f"{obj.__module__}.{getattr(obj, '__qualname__', hint)}"
        if getattr(target, "__name__", "") == "<lambda>":
            raise NotSelfContained(f"{qual} is a lambda (its source cannot be copied on its own)")
        if id(obj) in self._in_progress:      # recursion: the name is bound by the outer call
            return self._names_of.get(id(obj), obj.__name__)
        try:
            src, loaded_names = _source(target, target is obj and not inspect.isclass(obj))
        except (OSError, TypeError) as exc:
            raise NotSelfContained(f"no source for {qual}: {exc}") from None
        if _RELATIVE_IMPORT.search(src):
            raise NotSelfContained(f"{qual} imports from the audit package inside its body "
                                   f"(move the import to the module's top)")
        module_globals = vars(sys.modules[obj.__module__])
        closure = {}
        if not inspect.isclass(target) and target.__closure__:
            closure = {n: c.cell_contents for n, c in zip(target.__code__.co_freevars, target.__closure__)}
        own = obj.__name__
        global_name = next((k for k, v in module_globals.items() if v is obj), None)
        if global_name is not None and global_name != own:
            hint = global_name          # e.g. eager_attention, a closure named `attention`
        if not closure and module_globals.get(own) is obj:
            name = own                  # a module-level function or class: copied under its own name
            if name in self._bound and self._bound[name] is not obj:
                raise NotSelfContained(f"two different objects are both called {name!r}")
        else:
            name = self._unique(hint, obj)
        self._claim(name, obj)
        self._in_progress.add(id(obj))
        try:
            for loaded in loaded_names:
                if loaded in closure or loaded == own or (loaded.startswith("__") and loaded.endswith("__")):
                    continue
                if loaded in module_globals:
                    self.bind(loaded, module_globals[loaded])
                elif not hasattr(builtins, loaded):
                    raise NotSelfContained(f"{qual} uses {loaded!r}, which its module does not define")
            if not closure and name == own:
                self._chunks.append(src)
                return name
            lines = [f"def _make_{name}():"]
            for var, value in closure.items():
                if value is obj:
                    continue
                lines.append(f"    {var} = {self.expr(value, hint=var)}")
            lines.append(textwrap.indent(src.rstrip("\n"), "    "))
            lines.append(f"    return {own}")
            lines.append(f"\n\n{name} = _make_{name}()")
            self._chunks.append("\n".join(lines) + "\n")
            return name
        finally:
            self._in_progress.discard(id(obj))
