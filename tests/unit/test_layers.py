"""The package's layers, read from its source with ``ast`` (no import is run).

* No import cycle among scrapy_fleet modules, counting every ``import`` and ``from ... import``
  anywhere in a module (inside functions and methods too: an import deferred into a function
  is still a dependency, only a hidden one), and those under ``if TYPE_CHECKING:`` too: they
  never run, but a type named from a module above is still a dependency on it (stages/roles.py
  names what it needs of the scheduler with a Protocol instead).
* No ``_private`` name imported from another scrapy_fleet module (dunders such as
  ``__version__`` are public).
* The bottom layer (keys, codec, errors, Redis connection and URL parsing, settings catalog
  and checks) imports nothing of the package above it.
* No module reads or writes a ``_private`` attribute of an object other than ``self`` or
  ``cls`` (with ``getattr`` either: only engine_hooks.py touches Scrapy's internals).
* The scheduler is an adapter: it holds the pump and its lease book (no base class of
  the package) and uses their public interface only, never the buffers the pump handles.
"""

from __future__ import annotations

import ast
from pathlib import Path

from scrapy_fleet.frontier.book import BUFFERS
from scrapy_fleet.keys.calls import MONITOR_CALL
from scrapy_fleet.keys.crawl import CrawlKeys
from scrapy_fleet.monitoring.series import TIERS

PACKAGE = Path(__file__).resolve().parents[2] / "scrapy_fleet"

#: the bottom layer: these modules import each other only
BOTTOM = {
    "scrapy_fleet.catalog",
    "scrapy_fleet.checks",
    "scrapy_fleet.codec",
    "scrapy_fleet.errors",
    "scrapy_fleet.keys",  # (the package: its modules below)
    "scrapy_fleet.keys.calls",
    "scrapy_fleet.keys.crawl",
    "scrapy_fleet.keys.fleet",
    "scrapy_fleet.keys.naming",
    "scrapy_fleet.keys.partition",
    "scrapy_fleet.outage",
    "scrapy_fleet.redact",
    "scrapy_fleet.redis_client",
    "scrapy_fleet.redis_url",
    "scrapy_fleet.browser.pagemethods",  # the codec's PageMethod extension
    "scrapy_fleet.browser",  # (its __init__, run when pagemethods is imported)
}


def _modules() -> dict[str, tuple[Path, str]]:
    """Module name -> (file, the package relative imports start from)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
            package = ".".join(parts)
        else:
            package = ".".join(parts[:-1])
        out[".".join(parts)] = (path, package)
    return out


MODULES = _modules()


def _imports(name: str) -> list[tuple[str, str | None, int]]:
    """(module imported, name imported from it or None, line) for every scrapy_fleet import
    of module *name*, at any depth (in functions, under ``if TYPE_CHECKING:``)."""
    path, package = MODULES[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[tuple[str, str | None, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((a.name, None, node.lineno) for a in node.names
                       if a.name.split(".")[0] == "scrapy_fleet")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "scrapy_fleet":
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                out.append((sub, None, node.lineno) if sub in MODULES
                           else (source, alias.name, node.lineno))
    return out


def _targets(name: str, imports: list[tuple[str, str | None, int]]) -> set[str]:
    """The modules *name* depends on through *imports* (:func:`_imports`' rows): each module
    imported, and the packages above it (importing a module runs their ``__init__``), but
    for the top one, ``scrapy_fleet/__init__.py`` (the public face, which every import runs
    and which a module depends on only when it imports a name of it), and for *name*'s own
    packages, which Python runs before *name* anyway: a dependency on one of those only when
    *name* imports it (or a name of it) itself (lua/library.py once read lua/__init__.py's
    tables with ``from scrapy_fleet import lua`` while lua/__init__.py imported
    lua/library.py: a cycle this reader missed)."""
    targets = set()
    for module, _, _ in imports:
        parts = module.split(".")
        targets.update(t for t in (".".join(parts[:i]) for i in range(2, len(parts)))
                       if not name.startswith(t + "."))
        targets.add(module)
    return {t for t in targets if t in MODULES and t != name}


def _edges() -> dict[str, set[str]]:
    """Module -> the scrapy_fleet modules it imports (:func:`_targets`)."""
    return {name: _targets(name, _imports(name)) for name in MODULES}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_reader_sees_imports_inside_functions_and_under_type_checking():
    """The checks below rely on this reader: it must count an import hidden in a function
    (config.py's FleetConfig.frontier_params once imported frontier.client that way)."""
    imports = {module for module, _, _ in _imports("scrapy_fleet.commands.cli")}
    assert "scrapy_fleet.proxies.actions" in imports  # in a function
    assert "scrapy_fleet.config" in {  # under TYPE_CHECKING
        m for m, _, _ in _imports("scrapy_fleet.stages.roles")}
    # a module importing a name of its own package depends on the package's __init__; one
    # importing a sibling module does not (its package runs first whatever it imports)
    assert _targets("scrapy_fleet.lua.library", [("scrapy_fleet.lua", "SCRIPTS", 1)]) == {
        "scrapy_fleet.lua"}
    assert _targets("scrapy_fleet.lua.library", [("scrapy_fleet.lua.sources", None, 1)]) == {
        "scrapy_fleet.lua.sources"}
    assert "scrapy_fleet.frontier" in _targets(
        "scrapy_fleet.lua.library", [("scrapy_fleet.frontier.pump", None, 1)])
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]


def test_no_import_cycle():
    assert _cycles(_edges()) == []


def test_no_private_name_imported_from_another_module():
    found = []
    for name in MODULES:
        for module, imported, line in _imports(name):
            if (imported and imported.startswith("_") and not imported.startswith("__")
                    and module != name):
                found.append(f"{name}:{line} imports {module}.{imported}")
    assert found == []


def test_the_bottom_layer_imports_nothing_above_it():
    edges = _edges()
    assert BOTTOM <= set(MODULES)
    above = {f"{name} -> {target}" for name in BOTTOM for target in edges[name]
             if target not in BOTTOM}
    assert above == set()


def test_the_monitoring_keys_name_every_series_tier():
    """keys/crawl.py declares the series keys of the monitoring step (MONITOR_CALL) without
    importing monitoring/series.py (the layer above it): the two lists must agree."""
    keys = CrawlKeys("fleet", "c")
    declared = [name for name in MONITOR_CALL if name.startswith("series_")]
    assert declared == [f"series_{t}" for t in TIERS]
    assert [k for k in keys.call_keys(MONITOR_CALL, worker_id="w") if ":series:" in k] == [
        keys.series(t) for t in TIERS]


def test_components_reach_the_scheduler_through_its_ledger_only():
    """The middlewares, the failure watch and the pipeline get the scheduler's typed
    interface (frontier/ledger.py's LeaseLedger, engine_hooks.ledger_of), never the
    scheduler object itself (engine_hooks.scheduler_of and getattr probing)."""
    users = []
    for name, (path, _) in MODULES.items():
        if name == "scrapy_fleet.engine_hooks":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        users.extend(f"{name}:{node.lineno}" for node in ast.walk(tree)
                     if isinstance(node, ast.Attribute) and node.attr == "scheduler_of")
    assert users == []


#: (module, private attribute) read on another object, each with its reason
PRIVATE_REACH_ALLOWED = {
    ("scrapy_fleet.frontier.pump", "_exit"),  # os._exit: the drain timeout's hard exit
    # FleetConfig's cache on Scrapy's settings object (its own attribute)
    ("scrapy_fleet.config", "_fleet_config"),
    # Scrapy's RequestFingerprinter._fingerprint: is it Scrapy's own fingerprint function?
    ("scrapy_fleet.frontier.fingerprint", "_fingerprint"),
    # redis.asyncio's RedisCluster._determine_slot, overridden by our subclass so that FCALL's
    # keys are read from its arguments (no COMMAND GETKEYS round trip); in redis-py 5.0.1-8.1
    ("scrapy_fleet.redis_client", "_determine_slot"),
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_reaches_into_another_objects_private_attributes():
    """``x._name`` on ``self`` or ``cls`` only, and ``getattr(x, "_name")`` likewise; the
    engine's internals (``engine._slot``) only in engine_hooks.py."""
    found = []
    for name, (path, _) in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue
                attr = node.attr
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
                  and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
                  and isinstance(node.args[1].value, str) and _private(node.args[1].value)):
                if name == "scrapy_fleet.engine_hooks":
                    continue
                attr = node.args[1].value
            else:
                continue
            if (name, attr) not in PRIVATE_REACH_ALLOWED:
                found.append(f"{name}:{node.lineno} {ast.unparse(node)}")
    assert found == []


def _class(module: str, name: str) -> ast.ClassDef:
    tree = ast.parse(MODULES[module][0].read_text(encoding="utf-8"))
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)


def _members(cls: ast.ClassDef) -> set[str]:
    """Names a class defines: its methods and properties, and the attributes its methods
    assign on ``self``."""
    names = {n.name for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    for node in ast.walk(cls):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name) and node.value.id == "self"):
            names.add(node.attr)
    return names


def test_the_scheduler_holds_the_pump_and_uses_its_public_interface_only():
    """FleetScheduler inherits nothing of the package (it once inherited the pump and used
    20 of its private attributes); what it uses of the pump and the lease book (``self.pump``,
    ``self.book`` and locals named ``pump``/``book``) is a public member of theirs, and none
    of the buffers the pump alone handles (book.BUFFERS)."""
    scheduler = _class("scrapy_fleet.frontier.scheduler", "FleetScheduler")
    assert [ast.unparse(b) for b in scheduler.bases] == ["BaseScheduler"]
    members = {"pump": _members(_class("scrapy_fleet.frontier.pump", "FrontierPump")),
               "book": _members(_class("scrapy_fleet.frontier.book", "LeaseBook"))}
    assert set(BUFFERS) <= members["book"]
    used: dict[str, set[str]] = {"pump": set(), "book": set()}
    for node in ast.walk(scheduler):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if (isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name)
                and owner.value.id == "self" and owner.attr in used):
            used[owner.attr].add(node.attr)
        elif isinstance(owner, ast.Name) and owner.id in used:
            used[owner.id].add(node.attr)
    assert used["pump"] and used["book"]  # the reader sees them
    for part, names in used.items():
        assert {n for n in names if _private(n) or n not in members[part]} == set(), part
    assert used["book"] & set(BUFFERS) == set()


def _defined(module: str) -> set[str]:
    """Names module *module* defines at its top level (functions, classes, assignments,
    including those under ``if``/``try``), not the names it imports."""
    tree = ast.parse(MODULES[module][0].read_text(encoding="utf-8"))
    out: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(node.name)
            elif isinstance(node, ast.Assign):
                out.update(n.id for t in node.targets for n in ast.walk(t)
                           if isinstance(n, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out.add(node.target.id)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(node.orelse)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(tree.body)
    return out


def test_names_are_imported_from_the_module_that_defines_them():
    """No re-export shims (issue 20: nothing is released): a name is imported from the module
    that defines it.  The package's root (``from scrapy_fleet import Addon``, the public API
    of settings.py) is the one exception."""
    found = []
    for name in MODULES:
        for source, imported, line in _imports(name):
            if imported is None or source == "scrapy_fleet" or source not in MODULES:
                continue
            if imported not in _defined(source):
                found.append(f"{name}:{line} {imported} from {source}")
    assert found == []
