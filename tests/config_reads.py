"""Which config keys a stage's code reads, found statically (AST only, nothing imported).

The schema is read from src/eagle3_pipeline/core/config.py: the dataclasses reachable from
``Config`` and where each one sits (``HardwareConfig`` at ``hardware``, ``ServingConfig`` at
``hardware.serving``, ...). A *config value* is an expression known to stand for one place
of that tree (a dotted key, ``""`` for the root); the analysis follows them through a
module's functions and records every key read, with its file:line.

Where config values come from (the patterns understood):

* a parameter, variable or class field annotated with a schema type (``cfg: Config``,
  ``def f(t: TrainConfig)``, ``m: ModelConfig | None``): the type's one place in the tree
  (a type found at two places, ``ServerConfig``, is refused: its reads could not be placed);
* attribute chains on a config value (``cfg.train.lr``, ``cfg.hardware.serving.x``);
* aliases: ``t = cfg.train``, ``t, hw = cfg.train, cfg.hardware``, ``for s in (a, b)``,
  ``x := ...``, ``self.t = cfg.train`` (then ``self.t.lr`` in any method of the class);
* ``getattr(v, "key"[, default])`` / ``hasattr``, also with the name from a loop over a
  tuple of string constants (``for o in OPTIONS: getattr(cfg.train.draft, o)``), and
  ``attrgetter("a.b", ...)(v)`` with constant keys;
* ``dataclasses.replace(v, ...)``: the copy stands for the same place (no read by itself);
* properties and methods of the schema classes (``ModelConfig.built_here``,
  ``Config.validate_runtime()``): their own reads, placed where they are called;
* a section passed to a function of the package (resolved through imports, ``self.``/
  ``cls.`` methods, class constructors, or by method name for an unknown receiver): the
  callee's parameter must be annotated with the section's schema type, and the callee's own
  reads are then counted where it reads (``cfg.model`` passed on counts what the callee
  reads of it, not the whole section);
* a return annotated with a schema type, or ``tuple[Config, ...]`` unpacked
  (``cfg, args = config_from_cli(...)``);
* a call through a ``Callable[[..., T, ...], R]`` parameter or dataclass field
  (``body(cfg)``, ``builder.config(model.tiny)``): T must be the section's type, and every
  function the package binds to that slot (call sites, defaults) must take it annotated.

What a read is: a leaf key evaluated (``train.lr``); a section tested for presence
(``cfg.model.tiny is None``, ``if v.server:``, ``isinstance``): the key of the section;
a whole section consumed (``asdict(cfg.train)``): the section and everything under it.
Writing a field (``cfg.x = ...``) is no read.

Anything else a section flows into (an external call, a container, a return without a
schema annotation, an unannotated parameter, an attribute of an object of unknown type)
is refused with file:line: the test fails instead of guessing. Known sites that consume a
whole section without reading it for the stage are in :data:`SITES`, each with why.

Which reads count for a stage (:func:`stage_reads`): those of the functions it may run,
within its import closure (the closure tests/test_dvc_graph.py checks code deps against):
from the module-level code of every module of it and the ``__main__`` block of the stage
module (and of modules run as scripts, named in strings), through every function or class
referred to -- called or handed on as a callback; a class makes all its methods count; a
method of an object of unknown type counts every method of that name in the closure; a
function bound to a Callable slot counts where the slot is called.

Limits: it over-approximates (a referenced function counts whether or not the branch that
calls it runs; flow-insensitive within a function: ``x if flag else y`` reads both); it
under-approximates only through what it cannot see and does not refuse: code reached by
``getattr(module, name)`` with a computed name, or an object's attribute that holds a
config value where the object's type is unknown and the next attribute is not a schema
field. Errors are reported for every module of the closure, reached or not. Keys read only
to refuse a configuration while it is loaded (``core/config.py``'s ``validate``, run by
every stage: a bad value fails there, a good one changes no output) do not count: the
analysis does not enter :data:`NOT_READS`.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
CONFIG_MODULE = "eagle3_pipeline.core.config"

# Functions whose reads are not dependencies of any stage, and why.
NOT_READS = {
    f"{CONFIG_MODULE}.validate": "cross-key checks while loading (every stage): a bad value fails there, a good one "
    "changes no output",
    f"{CONFIG_MODULE}._check_model": "called by validate (the same)",
}

# Call sites that hand a whole section somewhere the analysis does not follow, keyed by
# (module, enclosing function, callee as written); the value says what the site means:
#   ("transfer", why): not a read here: whoever receives it reads for the stage, and their
#                      reads are counted where they are made;
#   ("whole", why):    a read of the whole section.
SITES: dict[tuple[str, str, str], tuple[str, str]] = {
    ("eagle3_pipeline.train.launch", "launch_torchrun", "OmegaConf.structured"): (
        "transfer",
        "the torchrun workers load this params file back (train.worker, in the "
        "stage's closure): their reads are counted in their own code",
    ),
    ("eagle3_pipeline.stages.runner", "run_stage", "volatile_outputs"): (
        "transfer",
        "runtime.keep resolves the stage's own ${...} outputs of dvc.yaml against "
        "the config: keys DVC tracks through the templating itself",
    ),
}


@dataclass(frozen=True)
class Read:
    key: str
    kind: str  # leaf | presence | whole
    where: str  # file:line
    owner: str = ""  # the function (or module:<module>, module:__main__) that reads

    def __str__(self) -> str:
        return f"{self.key} ({self.kind}, {self.where})"


def join(path: str, attr: str) -> str:
    return f"{path}.{attr}" if path else attr


# --------------------------------------------------------------------------- schema


def _annotation_names(node: ast.expr | None) -> list[ast.expr]:
    """The type names of an annotation (``X``, ``X | None``, ``Optional[X]``, ``"X"``)."""
    if node is None:
        return []
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _annotation_names(ast.parse(node.value, mode="eval").body)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _annotation_names(node.left) + _annotation_names(node.right)
    if isinstance(node, ast.Subscript) and _dotted(node.value) in ("Optional", "typing.Optional"):
        return _annotation_names(node.slice)
    if isinstance(node, ast.Constant) and node.value is None:
        return []
    return [node]


def _is_callable(ann: ast.expr | None) -> bool:
    return ann is not None and "Callable" in ast.unparse(ann)


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


@dataclass
class SchemaClass:
    name: str
    bases: list[str]
    fields: dict[str, tuple[str | None, bool]]  # name -> (section class | None, nullable)
    properties: dict[str, ast.FunctionDef]
    methods: dict[str, ast.FunctionDef]


class Schema:
    """The dataclasses of core/config.py and where each sits under ``Config``."""

    def __init__(self, path: Path) -> None:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        self.path = path
        classes = [
            n
            for n in tree.body
            if isinstance(n, ast.ClassDef)
            and any(
                _dotted(d.func if isinstance(d, ast.Call) else d) == "dataclass"
                for d in n.decorator_list
            )
        ]
        names = {c.name for c in classes}
        self.classes: dict[str, SchemaClass] = {}
        for c in classes:
            fields: dict[str, tuple[str | None, bool]] = {}
            props: dict[str, ast.FunctionDef] = {}
            meths: dict[str, ast.FunctionDef] = {}
            for b in c.bases:  # inherited fields first (RegenerateServerConfig(ServerConfig))
                if _dotted(b) in self.classes:
                    fields.update(self.classes[_dotted(b)].fields)
            for st in c.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    ann = st.annotation
                    types = [_dotted(n) for n in _annotation_names(ann)]
                    sections = [t for t in types if t in names]
                    nullable = "None" in ast.unparse(ann)
                    fields[st.target.id] = (sections[0] if sections else None, nullable)
                elif isinstance(st, ast.FunctionDef) and not st.name.startswith("__"):
                    if any(_dotted(d) == "property" for d in st.decorator_list):
                        props[st.name] = st
                    else:
                        meths[st.name] = st
            self.classes[c.name] = SchemaClass(
                c.name, [_dotted(b) or "" for b in c.bases], fields, props, meths
            )
        self.places: dict[str, str] = {"": "Config"}  # every section path -> its class
        todo = [""]
        while todo:
            p = todo.pop()
            for f, (sec, _) in self.classes[self.places[p]].fields.items():
                if sec is not None:
                    self.places[join(p, f)] = sec
                    todo.append(join(p, f))

    def is_subclass(self, cls: str, of: str) -> bool:
        if cls == of:
            return True
        return any(self.is_subclass(b, of) for b in self.classes[cls].bases if b in self.classes)

    def locations(self, cls: str) -> list[str]:
        return sorted(p for p, c in self.places.items() if self.is_subclass(c, cls))

    def type_at(self, path: str) -> str | None:
        """The schema class at a section path; None for a leaf."""
        return self.places.get(path)

    def is_key(self, path: str) -> bool:
        if path in self.places:
            return True
        parent, _, leaf = path.rpartition(".")
        return parent in self.places and leaf in self.classes[self.places[parent]].fields

    def nullable(self, path: str) -> bool:
        parent, _, leaf = path.rpartition(".")
        return bool(path) and self.classes[self.places[parent]].fields[leaf][1]

    def leaves(self, path: str) -> set[str]:
        """Every leaf key at or under ``path``."""
        if path not in self.places:
            return {path}
        out: set[str] = set()
        for f in self.classes[self.places[path]].fields:
            out |= self.leaves(join(path, f))
        return out


# --------------------------------------------------------------------------- package index


@functools.cache
def module_file(name: str, src: Path = SRC) -> Path | None:
    p = src / name.replace(".", "/")
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").is_file() else None


@dataclass
class Func:
    qual: str
    module: Module
    node: ast.FunctionDef | ast.AsyncFunctionDef
    cls: ClassInfo | None

    @property
    def kind(self) -> str:
        decos = {_dotted(d) for d in self.node.decorator_list}
        if "staticmethod" in decos:
            return "static"
        if "classmethod" in decos:
            return "class"
        return "method" if self.cls is not None else "function"


@dataclass
class ClassInfo:
    qual: str
    module: Module
    node: ast.ClassDef
    methods: dict[str, Func] = field(default_factory=dict)
    holders: dict[str, set[str]] = field(default_factory=dict)  # attr -> config paths

    @property
    def is_dataclass(self) -> bool:
        return any(
            _dotted(d.func if isinstance(d, ast.Call) else d)
            in ("dataclass", "dataclasses.dataclass")
            for d in self.node.decorator_list
        )


class Module:
    def __init__(self, name: str, index: Index) -> None:
        self.name = name
        self.index = index
        self.path = module_file(name, index.src)
        assert self.path is not None, name
        self.rel = self.path.relative_to(index.src.parent).as_posix()
        self.tree = ast.parse(self.path.read_text(encoding="utf-8"))
        self.is_pkg = self.path.name == "__init__.py"
        self.imports: dict[str, str] = {}  # local name -> qualified name
        self.defs: dict[str, Func | ClassInfo] = {}
        self.constants: dict[str, ast.expr] = {}
        for node in ast.walk(self.tree):  # imports at any depth (lazy imports included)
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.imports[a.asname] = a.name
                    else:
                        self.imports[a.name.split(".")[0]] = a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = name.split(".")
                    base = parts if self.is_pkg else parts[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                for a in node.names:
                    self.imports[a.asname or a.name] = f"{mod}.{a.name}"
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.defs[node.name] = Func(f"{name}.{node.name}", self, node, None)
            elif isinstance(node, ast.ClassDef):
                ci = ClassInfo(f"{name}.{node.name}", self, node)
                for st in node.body:
                    if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        ci.methods[st.name] = Func(f"{ci.qual}.{st.name}", self, st, ci)
                self.defs[node.name] = ci
            elif (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                self.constants[node.targets[0].id] = node.value
            elif (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and node.value is not None
            ):
                self.constants[node.target.id] = node.value

    def qualify(self, name: str) -> str:
        return self.imports.get(name, f"{self.name}.{name}")


class Index:
    """Every module of the package, parsed once; qualified names resolved across them."""

    def __init__(self, src: Path = SRC) -> None:
        self.src = src
        self.schema = Schema(module_file(CONFIG_MODULE, src))
        self.modules: dict[str, Module] = {}
        self._reads: dict[str, tuple[list[Read], list[str]]] = {}
        self._all: list[Module] | None = None
        self._calls: dict[str, list[tuple[Module, ast.Call]]] | None = None
        self._holders_done = False
        self._analyses: dict[str, ModuleAnalysis] = {}
        self._methods: dict[str, list[Func]] | None = None
        self._missing: set[str] = set()
        self.used_sites: set[tuple[str, str, str]] = set()  # of SITES, seen while recording
        self._holders: dict[str, list[ClassInfo]] | None = None
        self._callable_fields: dict[str, list[tuple[ClassInfo, int, ast.AnnAssign]]] | None = None

    def module(self, name: str) -> Module | None:
        if name not in self.modules:
            if name in self._missing:
                return None
            if not name.startswith("eagle3_pipeline") or module_file(name, self.src) is None:
                self._missing.add(name)
                return None
            self.modules[name] = Module(name, self)
        return self.modules[name]

    def lookup(self, qual: str, depth: int = 0) -> Func | ClassInfo | str | None:
        """A qualified name: a package function or class (following re-exports), a
        package module (its name), or None (outside the package)."""
        if depth > 10 or not qual.startswith("eagle3_pipeline"):
            return None
        if module_file(qual, self.src) is not None:
            return qual
        mod, _, attr = qual.rpartition(".")
        m = self.module(mod)
        if m is None:
            parent = self.lookup(mod, depth + 1)
            if isinstance(parent, ClassInfo):
                return parent.methods.get(attr)
            return None
        if attr in m.defs:
            return m.defs[attr]
        if attr in m.imports:
            return self.lookup(m.imports[attr], depth + 1)
        return None

    def schema_class(self, module: Module, ann: ast.expr | None) -> str | None:
        """The schema class an annotation names (None: no schema type)."""
        for n in _annotation_names(ann):
            d = _dotted(n)
            if d is None:
                continue
            head, _, rest = d.partition(".")
            qual = module.qualify(head) + (f".{rest}" if rest else "")
            mod, _, cls = qual.rpartition(".")
            if mod == CONFIG_MODULE and cls in self.schema.classes:
                return cls
        return None

    def methods_named(self, name: str) -> list[Func]:
        if self._methods is None:
            self._methods = {}
            for m in self.all_modules():
                for d in m.defs.values():
                    if isinstance(d, ClassInfo):
                        for n, f in d.methods.items():
                            self._methods.setdefault(n, []).append(f)
        return self._methods.get(name, [])

    def all_modules(self) -> list[Module]:
        if self._all is None:
            for p in sorted((self.src / "eagle3_pipeline").rglob("*.py")):
                rel = p.relative_to(self.src).with_suffix("")
                parts = list(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
                self.module(".".join(parts))
            self._all = list(self.modules.values())
        return self._all

    def analysis(self, module: str) -> ModuleAnalysis:
        if module not in self._analyses:
            m = self.module(module)
            assert m is not None, module
            self._analyses[module] = ModuleAnalysis(m)
            self._analyses[module].settle()
        return self._analyses[module]

    def holders(self) -> dict[str, list[ClassInfo]]:
        """The classes holding a config value in an attribute, by attribute name."""
        if self._holders is None:
            self.settle_all()
            self._holders = {}
            for m in self.all_modules():
                for d in m.defs.values():
                    if isinstance(d, ClassInfo):
                        for attr in d.holders:
                            self._holders.setdefault(attr, []).append(d)
        return self._holders

    def settle_all(self) -> None:
        if not self._holders_done:
            self._holders_done = True
            for m in self.all_modules():
                self.analysis(m.name)

    def reads(self, module: str) -> tuple[list[Read], list[str]]:
        """The reads of one module's code and what it could not resolve (file:line: why)."""
        if module not in self._reads:
            self._reads[module] = self.analysis(module).run()
        return self._reads[module]

    def callable_fields(self, name: str) -> list[tuple[ClassInfo, int, ast.AnnAssign]]:
        """Dataclass fields of the package named ``name`` and annotated Callable."""
        if self._callable_fields is None:
            self._callable_fields = {}
            for m in self.all_modules():
                for d in m.defs.values():
                    if isinstance(d, ClassInfo) and d.is_dataclass:
                        fields = [
                            st
                            for st in d.node.body
                            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)
                        ]
                        for k, f in enumerate(fields):
                            if _is_callable(f.annotation):
                                self._callable_fields.setdefault(f.target.id, []).append((d, k, f))
        return self._callable_fields.get(name, [])

    def calls_to(self, target: Func | ClassInfo) -> list[tuple[Module, ast.Call]]:
        """Every call of a package function or class, where its name resolves at module
        level (a plain or imported name, a module attribute)."""
        if self._calls is None:
            self._calls = {}
            for m in self.all_modules():
                for node in ast.walk(m.tree):
                    if not isinstance(node, ast.Call):
                        continue
                    d = _dotted(node.func)
                    if d is None:
                        continue
                    head, _, rest = d.partition(".")
                    qual = m.qualify(head) + (f".{rest}" if rest else "")
                    found = self.lookup(qual)
                    if isinstance(found, (Func, ClassInfo)):
                        self._calls.setdefault(found.qual, []).append((m, node))
        return self._calls.get(target.qual, [])


# --------------------------------------------------------------------------- analysis

EMPTY: frozenset[str] = frozenset()
BUILTIN_PRESENCE = {"isinstance", "bool", "callable", "id", "type"}


class Scope:
    """One function (or the module's top level): names bound to config values."""

    def __init__(
        self,
        an: ModuleAnalysis,
        node: ast.AST,
        parent: Scope | None,
        func: Func | None = None,
        self_binding: frozenset[str] = EMPTY,
    ) -> None:
        self.an, self.node, self.parent, self.func = an, node, parent, func
        self.owner = parent.owner if parent is not None else f"{an.module.name}:<module>"
        self.env: dict[str, set[str]] = {}
        self.strs: dict[str, set[str]] = {}
        self.local_defs: dict[str, Func] = {}
        self.self_name: str | None = None
        self.cls: ClassInfo | None = func.cls if func else None
        self.returns: str | None = None  # schema class of the return annotation
        self.returns_tuple: list[str | None] | None = None  # or of a tuple[...] one
        self.params: dict[str, ast.arg] = {}
        args = getattr(node, "args", None)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.returns = an.index.schema_class(an.module, node.returns)
            self.returns_tuple = an.tuple_types(an.module, node.returns)
        if args is not None:
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
            self.params = {a.arg: a for a in [*every, args.vararg, args.kwarg] if a}
            if func is not None and func.kind in ("method", "class") and every:
                self.self_name = every[0].arg
                if self_binding:
                    self.env[every[0].arg] = set(self_binding)
            for a in every:
                cls = an.index.schema_class(an.module, a.annotation)
                if cls is None:
                    continue
                locs = an.index.schema.locations(cls)
                if len(locs) != 1:
                    an.error(
                        a,
                        f"parameter {a.arg}: {cls} sits at {', '.join(locs)}: "
                        "its reads cannot be placed",
                        always=True,
                    )
                self.env[a.arg] = set(locs)

    def lookup(self, name: str) -> set[str] | None:
        s: Scope | None = self
        while s is not None:
            if name in s.env:
                return s.env[name]
            s = s.parent
        return None

    def lookup_strs(self, name: str) -> set[str] | None:
        s: Scope | None = self
        while s is not None:
            if name in s.strs:
                return s.strs[name]
            s = s.parent
        const = self.an.constant_strings(self.an.module, name)
        return const

    def find_param(self, name: str) -> tuple[Scope, ast.arg] | None:
        s: Scope | None = self
        while s is not None:
            if name in s.env or name in s.local_defs:
                return None
            if name in s.params:
                return s, s.params[name]
            s = s.parent
        return None

    def enclosing_self(self) -> tuple[str | None, ClassInfo | None]:
        s: Scope | None = self
        while s is not None:
            if s.self_name is not None:
                return s.self_name, s.cls
            s = s.parent
        return None, None

    def function_name(self) -> str:
        s: Scope | None = self
        while s is not None:
            if s.func is not None:
                return s.func.node.name
            s = s.parent
        return "<module>"


class ModuleAnalysis:
    def __init__(self, module: Module) -> None:
        self.module = module
        self.index = module.index
        self.schema = self.index.schema
        self.recording = False
        self.reads: list[Read] = []
        self.errors: list[str] = []
        self.changed = False
        self._bound: list[tuple[str, str, str]] = []  # schema methods: (class, name, path)
        self._scopes_cache: list[tuple[Scope, list[ast.stmt]]] | None = None
        self._expanding: set[tuple[str, str, str]] = set()
        # what each owner refers to: ("func"|"class", qual), ("name", attribute of an
        # object of unknown type), ("entry", a module run as a script)
        self.refs: dict[str, set[tuple[str, str]]] = {}
        self._owner = ""
        self._no_refs = 0

    # ------------------------------------------------------------------ bookkeeping

    def where(self, node: ast.AST) -> str:
        return f"{self.module.rel}:{getattr(node, 'lineno', 0)}"

    def error(self, node: ast.AST, msg: str, always: bool = False) -> None:
        """Record what cannot be followed (``always``: found once, while scopes are
        built, not in the recording pass)."""
        if self.recording or always:
            self.errors.append(f"{self.where(node)}: {msg}")

    def read(self, key: str, kind: str, node: ast.AST, via: str = "") -> None:
        if self.recording:
            self.reads.append(Read(key, kind, self.where(node) + via, self._owner))

    def ref(self, found: object) -> None:
        """The current owner refers to a package function or class (it may run it)."""
        if not self.recording or self._no_refs:
            return
        if isinstance(found, Func):
            self.refs.setdefault(self._owner, set()).add(("func", found.qual))
        elif isinstance(found, ClassInfo):
            self.refs.setdefault(self._owner, set()).add(("class", found.qual))
        elif isinstance(found, tuple):
            self.refs.setdefault(self._owner, set()).add(found)

    def bind(self, table: dict[str, set[str]], name: str, paths: set[str]) -> None:
        new = paths - table.get(name, set())
        if new:
            table.setdefault(name, set()).update(new)
            self.changed = True

    def sections(self, paths: frozenset[str] | set[str]) -> set[str]:
        return {p for p in paths if self.schema.type_at(p) is not None}

    def constant_strings(self, module: Module, name: str, depth: int = 0) -> set[str] | None:
        """A module-level tuple/list of string constants (also imported), as a set."""
        value = module.constants.get(name)
        if value is None and name in module.imports and depth < 5:
            qual = module.imports[name]
            mod, _, attr = qual.rpartition(".")
            m = self.index.module(mod)
            return self.constant_strings(m, attr, depth + 1) if m else None
        if (
            isinstance(value, (ast.Tuple, ast.List))
            and value.elts
            and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts)
        ):
            return {e.value for e in value.elts}
        return None

    # ------------------------------------------------------------------ driver

    def settle(self) -> None:
        """Aliases and ``self.X`` holders to a fixpoint, silently."""
        if self._scopes_cache is not None:
            return
        self._scopes_cache = scopes = self._scopes()
        for _ in range(10):
            self.changed = False
            for scope, body in scopes:
                self.body(scope, body)
            if not self.changed:
                break

    def run(self) -> tuple[list[Read], list[str]]:
        self.settle()
        self.index.settle_all()  # every class's holders known (see _check_unknown_holder)
        self.recording = True
        for scope, body in self._scopes_cache or []:
            self._owner = scope.owner
            self.body(scope, body)
        return self.reads, self.errors

    def tuple_types(self, module: Module, ann: ast.expr | None) -> list[str | None] | None:
        """The schema classes of a ``tuple[A, B]`` annotation's items (None: not one)."""
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            ann = ast.parse(ann.value, mode="eval").body
        if not (
            isinstance(ann, ast.Subscript)
            and _dotted(ann.value) in ("tuple", "Tuple", "typing.Tuple")
            and isinstance(ann.slice, ast.Tuple)
        ):
            return None
        return [self.index.schema_class(module, e) for e in ann.slice.elts]

    def _scopes(self) -> list[tuple[Scope, list[ast.stmt]]]:
        """Every scope of the module with its statements, outermost first."""
        m = self.module
        top = Scope(self, m.tree, None)
        out: list[tuple[Scope, list[ast.stmt]]] = []
        top_body = []
        for st in m.tree.body:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                func = m.defs[st.name]
                assert isinstance(func, Func)
                self._function(func, top, out)
                top_body.append(st)  # its decorators and defaults run at import
            elif isinstance(st, ast.ClassDef):
                if m.name == CONFIG_MODULE and st.name in self.schema.classes:
                    continue  # the schema's own definitions (its members expand where used)
                ci = m.defs[st.name]
                assert isinstance(ci, ClassInfo)
                cscope = Scope(self, st, top)
                cscope.cls = ci
                body = []
                for s in st.body:
                    if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self._function(ci.methods[s.name], top, out)
                        body.append(s)
                    elif isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
                        cls = self.index.schema_class(m, s.annotation)
                        if cls is not None:  # a field holding a config value
                            locs = self.schema.locations(cls)
                            if len(locs) != 1:
                                self.error(
                                    s,
                                    f"field {s.target.id}: {cls} sits at {', '.join(locs)}",
                                    always=True,
                                )
                            ci.holders[s.target.id] = set(locs)
                        if s.value is not None:
                            body.append(ast.Expr(s.value, lineno=s.lineno, col_offset=s.col_offset))
                    else:
                        body.append(s)
                out.append((cscope, body))
            elif isinstance(st, ast.If) and ast.unparse(st.test) in (
                "__name__ == '__main__'",
                '__name__ == "__main__"',
            ):
                main = Scope(self, st, top)
                main.owner = f"{m.name}:__main__"  # runs only when run as a script
                out.append((main, st.body))
            else:
                top_body.append(st)
        out.insert(0, (top, top_body))
        return out

    def _function(self, func: Func, parent: Scope, out: list[tuple[Scope, list[ast.stmt]]]) -> None:
        if func.qual in NOT_READS:
            return
        scope = Scope(self, func.node, parent, func)
        scope.owner = func.qual
        out.append((scope, func.node.body))
        self._nested(func.node.body, scope, out)

    def _nested(
        self, body: list[ast.stmt], scope: Scope, out: list[tuple[Scope, list[ast.stmt]]]
    ) -> None:
        for node in body:
            for sub in ast.walk(node):
                if (
                    isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and sub is not scope.node
                    and self._holder_stmt(sub, body) is node
                ):
                    f = Func(
                        f"{scope.func.qual if scope.func else self.module.name}.{sub.name}",
                        self.module,
                        sub,
                        None,
                    )
                    inner = Scope(self, sub, scope, f)
                    scope.local_defs[sub.name] = f
                    out.append((inner, sub.body))
                    self._nested(sub.body, inner, out)

    @staticmethod
    def _holder_stmt(target: ast.AST, body: list[ast.stmt]) -> ast.AST | None:
        """The statement of ``body`` that holds ``target`` directly (not through another
        nested def)."""
        for st in body:
            stack = [st]
            while stack:
                n = stack.pop()
                for ch in ast.iter_child_nodes(n):
                    if ch is target:
                        return st
                    if not isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        stack.append(ch)
        return None

    # ------------------------------------------------------------------ statements

    def body(self, scope: Scope, stmts: list[ast.stmt]) -> None:
        for st in stmts:
            self.stmt(scope, st)

    def stmt(self, s: Scope, st: ast.stmt) -> None:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in st.decorator_list:
                self.expr(s, d)
            a = st.args
            positional = [*a.posonlyargs, *a.args]
            pairs = [
                *zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True),
                *zip(a.kwonlyargs, a.kw_defaults, strict=True),
            ]
            for arg, dflt in pairs:
                if dflt is not None:  # a Callable parameter's default is bound, not run
                    self._no_refs += _is_callable(arg.annotation)
                    self.expr(s, dflt)
                    self._no_refs -= _is_callable(arg.annotation)
            return  # its body is a scope of its own
        if isinstance(st, ast.ClassDef):
            return
        if isinstance(st, ast.Assign):
            for t in st.targets:
                self.assign(s, t, st.value)
            if len(st.targets) > 1:
                pass
            return
        if isinstance(st, ast.AnnAssign):
            cls = self.index.schema_class(self.module, st.annotation)
            if cls is not None and isinstance(st.target, ast.Name):
                locs = self.schema.locations(cls)
                if len(locs) != 1:
                    self.error(st, f"{st.target.id}: {cls} sits at {', '.join(locs)}")
                self.bind(s.env, st.target.id, set(locs))
            if st.value is not None:
                self.assign(s, st.target, st.value)
            return
        if isinstance(st, ast.AugAssign):
            self.expr(s, st.value)
            self.expr(s, st.target, "store")
            return
        if isinstance(st, (ast.For, ast.AsyncFor)):
            self.loop_bind(s, st.target, st.iter)
            self.body(s, st.body)
            self.body(s, st.orelse)
            return
        if isinstance(st, (ast.If, ast.While)):
            self.expr(s, st.test, "presence")
            self.body(s, st.body)
            self.body(s, st.orelse)
            return
        if isinstance(st, ast.Assert):
            self.expr(s, st.test, "presence")
            if st.msg is not None:
                self.expr(s, st.msg)
            return
        if isinstance(st, ast.Return):
            if (
                isinstance(st.value, ast.Tuple)
                and s.returns_tuple is not None
                and len(st.value.elts) == len(s.returns_tuple)
            ):
                for e, want in zip(st.value.elts, s.returns_tuple, strict=True):
                    got = self.sections(self.expr(s, e, "alias"))
                    if got and (
                        want is None
                        or not all(
                            self.schema.is_subclass(self.schema.type_at(p), want) for p in got
                        )
                    ):
                        self.error(
                            e,
                            f"returns config section(s) {sorted(got)} in a tuple "
                            "item not annotated with its schema type",
                        )
                return
            if st.value is not None:
                got = self.sections(self.expr(s, st.value, "alias"))
                if got and (
                    s.returns is None
                    or not all(
                        self.schema.is_subclass(self.schema.type_at(p), s.returns) for p in got
                    )
                ):
                    self.error(
                        st,
                        f"returns config section(s) {sorted(got)} without a schema "
                        "return annotation: its callers' reads cannot be followed",
                    )
            return
        if isinstance(st, (ast.With, ast.AsyncWith)):
            for item in st.items:
                self.expr(s, item.context_expr)
                if item.optional_vars is not None:
                    self.expr(s, item.optional_vars, "store")
            self.body(s, st.body)
            return
        if isinstance(st, ast.Try) or type(st).__name__ == "TryStar":
            self.body(s, st.body)
            for h in st.handlers:
                if h.type is not None:
                    self.expr(s, h.type)
                self.body(s, h.body)
            self.body(s, st.orelse)
            self.body(s, st.finalbody)
            return
        if isinstance(st, ast.Match):
            self.expr(s, st.subject)
            for case in st.cases:
                if case.guard is not None:
                    self.expr(s, case.guard, "presence")
                self.body(s, case.body)
            return
        if isinstance(st, ast.Expr):
            self.expr(s, st.value, "alias")  # a discarded value is no read
            return
        for ch in ast.iter_child_nodes(st):  # Raise, Delete, ...
            if isinstance(ch, ast.expr):
                self.expr(s, ch)
            elif isinstance(ch, ast.stmt):
                self.stmt(s, ch)

    def assign(self, s: Scope, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, ast.Call):
            self.expr(s, value, "alias")
            cands, _ = self.candidates(s, value.func, self.callee_name(s, value.func))
            for c in cands:
                types = self.tuple_types(c.module, c.node.returns)
                if types is None or len(types) != len(target.elts):
                    continue
                for t, cls in zip(target.elts, types, strict=True):
                    if cls is not None and isinstance(t, ast.Name):
                        locs = self.schema.locations(cls)
                        if len(locs) != 1:
                            self.error(t, f"{c.qual} returns {cls}, which sits at {locs}")
                        self.bind(s.env, t.id, set(locs))
            return
        if (
            isinstance(target, (ast.Tuple, ast.List))
            and isinstance(value, (ast.Tuple, ast.List))
            and len(target.elts) == len(value.elts)
            and not any(isinstance(e, ast.Starred) for e in target.elts)
        ):
            for t, v in zip(target.elts, value.elts, strict=True):
                self.assign(s, t, v)
            return
        if isinstance(target, ast.Name):
            paths = self.sections(self.expr(s, value, "alias"))
            if paths:
                self.bind(s.env, target.id, paths)
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                self.bind(s.strs, target.id, {value.value})
            return
        self_name, cls = s.enclosing_self()
        if (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == self_name
            and cls is not None
        ):
            paths = self.sections(self.expr(s, value, "alias"))
            if paths:
                self.bind(cls.holders, target.attr, paths)
            return
        self.expr(s, value)  # a section stored anywhere else is refused ("value")
        self.expr(s, target, "store")

    def loop_bind(self, s: Scope, target: ast.expr, it: ast.expr) -> None:
        if isinstance(target, ast.Name):
            if isinstance(it, (ast.Tuple, ast.List, ast.Set)):
                strs = [
                    e.value
                    for e in it.elts
                    if isinstance(e, ast.Constant) and isinstance(e.value, str)
                ]
                if strs and len(strs) == len(it.elts):
                    self.bind(s.strs, target.id, set(strs))
                    return
                paths: set[str] = set()
                for e in it.elts:
                    paths |= self.sections(self.expr(s, e, "alias"))
                if paths:
                    self.bind(s.env, target.id, paths)
                return
            if isinstance(it, ast.Name) and s.lookup(it.id) is None:
                consts = s.lookup_strs(it.id)
                if consts:
                    self.bind(s.strs, target.id, consts)
                    return
        self.expr(s, it)
        self.expr(s, target, "store")

    # ------------------------------------------------------------------ expressions

    def use(self, paths: set[str] | frozenset[str], ctx: str, node: ast.AST) -> frozenset[str]:
        """Apply a context to a value: a section is fine where it is passed on (alias,
        attribute base, argument, return), a read where it is tested (presence) or
        consumed (whole), and refused anywhere else."""
        secs = self.sections(paths)
        if secs:
            if ctx == "presence":
                for p in secs:
                    self.read(p, "presence", node)
            elif ctx == "whole":
                for p in secs:
                    self.read(p, "whole", node)
            elif ctx not in ("alias", "attrbase", "arg", "callee", "store"):
                self.error(
                    node,
                    f"config section(s) {sorted(secs)} used in a way the "
                    f"analysis cannot follow: {ast.unparse(node)[:80]}",
                )
        return frozenset(paths)

    def expr(self, s: Scope, node: ast.expr | None, ctx: str = "value") -> frozenset[str]:
        if node is None:
            return EMPTY
        handler = getattr(self, f"e_{type(node).__name__}", None)
        if handler is not None:
            return handler(s, node, ctx)
        self.children(s, node)
        return EMPTY

    def children(self, s: Scope, node: ast.AST, ctx: str = "value") -> None:
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, ast.expr):
                self.expr(s, ch, ctx)
            elif isinstance(ch, ast.keyword):
                self.expr(s, ch.value, ctx)
            elif isinstance(ch, ast.comprehension):
                self.loop_bind(s, ch.target, ch.iter)
                for cond in ch.ifs:
                    self.expr(s, cond, "presence")

    def e_Name(self, s: Scope, node: ast.Name, ctx: str) -> frozenset[str]:
        if isinstance(node.ctx, ast.Store):
            return EMPTY
        paths = s.lookup(node.id)
        if paths is None and self.recording and not self._no_refs:
            self.ref(self.resolve_name(s, node.id))
        return self.use(paths or EMPTY, ctx, node)

    def resolve_name(self, s: Scope, name: str) -> Func | ClassInfo | str | None:
        """What a plain name refers to in the package (a local def, a module-level def
        or class, an import), or None."""
        sc: Scope | None = s
        while sc is not None:
            if name in sc.local_defs:
                return sc.local_defs[name]
            if name in sc.params:
                return None
            sc = sc.parent
        if name in self.module.defs:
            return self.module.defs[name]
        if name in self.module.imports:
            return self.index.lookup(self.module.imports[name])
        return None

    def e_Constant(self, s: Scope, node: ast.Constant, ctx: str) -> frozenset[str]:
        v = node.value
        if isinstance(v, str) and v.startswith("eagle3_pipeline.") and self.recording:
            mod, _, attr = v.partition(":")  # a module run as a script, or mod:Class
            if module_file(mod, self.index.src) is not None:
                self.ref(("entry", mod))
                if attr:
                    self.ref(self.index.lookup(f"{mod}.{attr}"))
        return EMPTY

    def e_Lambda(self, s: Scope, node: ast.Lambda, ctx: str) -> frozenset[str]:
        inner = Scope(self, node, s)
        self.expr(inner, node.body)
        return EMPTY

    def e_ListComp(self, s: Scope, node: ast.AST, ctx: str) -> frozenset[str]:
        for gen in node.generators:
            self.loop_bind(s, gen.target, gen.iter)
            for cond in gen.ifs:
                self.expr(s, cond, "presence")
        for name in ("elt", "key", "value"):
            if hasattr(node, name):
                self.expr(s, getattr(node, name))
        return EMPTY

    e_SetComp = e_GeneratorExp = e_DictComp = e_ListComp

    def e_NamedExpr(self, s: Scope, node: ast.NamedExpr, ctx: str) -> frozenset[str]:
        paths = self.expr(s, node.value, "alias")
        if self.sections(paths):
            self.bind(s.env, node.target.id, self.sections(paths))
        return self.use(paths, ctx, node)

    def e_BoolOp(self, s: Scope, node: ast.BoolOp, ctx: str) -> frozenset[str]:
        out: set[str] = set()
        for i, v in enumerate(node.values):
            last = i == len(node.values) - 1
            paths = self.expr(s, v, "alias")
            secs = self.sections(paths)
            for p in secs:  # every operand but the result is tested; the last may be too
                self.read(p, "presence", v)
            if ctx != "presence" or not last:
                out |= secs
        return self.use(out, ctx, node)

    def e_IfExp(self, s: Scope, node: ast.IfExp, ctx: str) -> frozenset[str]:
        self.expr(s, node.test, "presence")
        inner = "alias" if ctx != "presence" else "presence"
        out = self.expr(s, node.body, inner) | self.expr(s, node.orelse, inner)
        return self.use(out, ctx, node)

    def e_UnaryOp(self, s: Scope, node: ast.UnaryOp, ctx: str) -> frozenset[str]:
        self.expr(s, node.operand, "presence" if isinstance(node.op, ast.Not) else "value")
        return EMPTY

    def e_Compare(self, s: Scope, node: ast.Compare, ctx: str) -> frozenset[str]:
        identity = all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops)
        for v in [node.left, *node.comparators]:
            self.expr(s, v, "presence" if identity else "value")
        return EMPTY

    def e_Attribute(self, s: Scope, node: ast.Attribute, ctx: str) -> frozenset[str]:
        self_name, cls = s.enclosing_self()
        if (
            isinstance(node.value, ast.Name)
            and node.value.id == self_name
            and cls is not None
            and node.attr in cls.holders
            and s.lookup(self_name) is None
        ):
            if ctx == "store":
                return EMPTY
            return self.use(cls.holders[node.attr], ctx, node)
        base = self.expr(s, node.value, "attrbase")
        if not base:
            self._check_unknown_holder(node)
            if self.recording and not self._no_refs and isinstance(node.ctx, ast.Load):
                self.ref(self.resolve_attribute(s, node))
            return EMPTY
        if ctx == "store":
            return EMPTY  # writing a field is no read
        out: set[str] = set()
        for p in base:
            out |= self.member(s, node, p, node.attr, ctx)
        return self.use(out, ctx, node)

    def member(self, s: Scope, node: ast.AST, path: str, attr: str, ctx: str) -> set[str]:
        """``<config value at path>.attr``."""
        cls = self.schema.type_at(path)
        if cls is None:
            return set()  # an attribute of a plain value (an Enum's .value, str methods)
        sc = self.schema.classes[cls]
        if attr in sc.fields:
            q = join(path, attr)
            if self.schema.type_at(q) is None:
                self.read(q, "leaf", node)
            return {q}
        if attr in sc.properties:
            return set(self.expand(cls, sc.properties[attr], path, node))
        if attr in sc.methods:
            if ctx != "callee":
                self.error(node, f"{cls}.{attr} used without calling it")
            self._bound.append((cls, attr, path))
            return set()
        self.error(node, f"{cls} ({path or 'the root'}) has no field {attr!r}")
        return set()

    def expand(self, cls: str, fn: ast.FunctionDef, path: str, at: ast.AST) -> frozenset[str]:
        """A schema property or method, with ``self`` at ``path``: its reads are made at
        ``at``; returns the config values it returns."""
        key = (cls, fn.name, path)
        if key in self._expanding:
            return EMPTY
        self._expanding.add(key)
        try:
            func = Func(
                f"{CONFIG_MODULE}.{cls}.{fn.name}",
                self.index.module(CONFIG_MODULE),
                fn,
                ClassInfo(f"{CONFIG_MODULE}.{cls}", self.module, ast.ClassDef(name=cls)),
            )
            sub = ModuleAnalysis(self.index.module(CONFIG_MODULE))
            sub.recording = self.recording
            scope = Scope(sub, fn, None, func, frozenset({path}))
            ret: set[str] = set()
            for _ in range(2):
                sub.reads, sub.errors = [], []
                sub.body(scope, fn.body)
                for st in ast.walk(fn):
                    if isinstance(st, ast.Return) and st.value is not None:
                        sub.recording, was = False, sub.recording
                        ret |= sub.sections(sub.expr(scope, st.value, "alias"))
                        sub.recording = was
            via = f" via {cls}.{fn.name}"
            for r in sub.reads:
                self.read(r.key, r.kind, at, via + f" ({r.where})")
            self.errors.extend(f"{self.where(at)}{via}: {e}" for e in sub.errors)
            return frozenset(ret)
        finally:
            self._expanding.discard(key)

    def resolve_attribute(self, s: Scope, node: ast.Attribute) -> object:
        """What ``x.attr`` may refer to: a module's function or class, a method of the
        class of ``self``/a named class, else any method of that name (unknown type)."""
        d = _dotted(node.value)
        if d is not None and s.lookup(d.split(".")[0]) is None:
            head, _, rest = d.partition(".")
            base = self.resolve_name(s, head)
            if isinstance(base, str):  # a module
                return self.index.lookup(f"{base}{'.' + rest if rest else ''}.{node.attr}") or (
                    "name",
                    node.attr,
                )
            if isinstance(base, ClassInfo) and not rest:
                return self.class_method(base, node.attr) or ("name", node.attr)
            self_name, cls = s.enclosing_self()
            if head == self_name and not rest and cls is not None:
                return self.class_method(cls, node.attr) or ("name", node.attr)
        return ("name", node.attr)

    def _check_unknown_holder(self, node: ast.Attribute) -> None:
        """``obj.cfg.train`` with ``obj`` of unknown type, where a class of the package
        holds a config value in ``cfg``: refuse rather than guess."""
        inner = node.value
        if not isinstance(inner, ast.Attribute) or not self.recording:
            return
        for d in self.index.holders().get(inner.attr, []):
            for p in d.holders[inner.attr]:
                sc = self.schema.classes[self.schema.type_at(p)]
                if node.attr in sc.fields or node.attr in sc.properties:
                    self.error(
                        node,
                        f"{ast.unparse(node)[:60]}: {d.qual} holds config in "
                        f".{inner.attr}, but the type of "
                        f"{ast.unparse(inner.value)[:40]} is unknown",
                    )
                    return

    # ------------------------------------------------------------------ calls

    def callee_name(self, s: Scope, func: ast.expr) -> str | None:
        """The callee as a qualified name where it is a plain name or a module attribute."""
        if isinstance(func, ast.Name):
            if s.lookup(func.id) is not None:
                return None
            if s.find_param(func.id) is not None:
                return f"param:{func.id}"
            sc: Scope | None = s
            while sc is not None:
                if func.id in sc.local_defs:
                    return sc.local_defs[func.id].qual
                sc = sc.parent
            if func.id in self.module.imports:
                return self.module.imports[func.id]
            if func.id in self.module.defs:
                return f"{self.module.name}.{func.id}"
            return f"builtins.{func.id}"
        if isinstance(func, ast.Attribute):
            d = _dotted(func.value)
            if d is not None:
                head, _, rest = d.partition(".")
                if s.lookup(head) is None and head in self.module.imports:
                    return f"{self.module.imports[head]}{'.' + rest if rest else ''}.{func.attr}"
                if s.lookup(head) is None and head in self.module.defs and not rest:
                    return f"{self.module.name}.{head}.{func.attr}"
        return None

    def candidates(self, s: Scope, func: ast.expr, qual: str | None) -> tuple[list[Func], bool]:
        """The package functions a call may run, and whether the first parameter is
        bound (a method called on an instance)."""
        if qual is not None:
            sc: Scope | None = s
            while isinstance(func, ast.Name) and sc is not None:
                if func.id in sc.local_defs:
                    return [sc.local_defs[func.id]], False
                sc = sc.parent
            found = self.index.lookup(qual)
            if isinstance(found, Func):
                return [found], found.kind in ("method", "class") and isinstance(
                    func, ast.Attribute
                )
            if isinstance(found, ClassInfo):
                init = self.class_method(found, "__init__")
                return ([init] if init else []), True
            return [], False
        if isinstance(func, ast.Attribute):
            self_name, cls = s.enclosing_self()
            if isinstance(func.value, ast.Name) and func.value.id == self_name and cls:
                m = self.class_method(cls, func.attr)
                if m is not None:
                    return [m], m.kind != "static"
            return [f for f in self.index.methods_named(func.attr)], True
        return [], False

    def class_method(self, ci: ClassInfo, name: str) -> Func | None:
        if name in ci.methods:
            return ci.methods[name]
        for b in ci.node.bases:
            d = _dotted(b)
            if d is None:
                continue
            found = self.index.lookup(
                ci.module.qualify(d.split(".")[0]) + (d[len(d.split(".")[0]) :])
            )
            if isinstance(found, ClassInfo):
                m = self.class_method(found, name)
                if m is not None:
                    return m
        return None

    def dataclass_fields(self, ci: ClassInfo) -> list[ast.AnnAssign]:
        return [
            st
            for st in ci.node.body
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)
        ]

    def e_Call(self, s: Scope, node: ast.Call, ctx: str) -> frozenset[str]:
        func = node.func
        qual = self.callee_name(s, func)
        short = qual.rpartition(".")[2] if qual else None
        # attrgetter("a.b")(v)
        if isinstance(func, ast.Call) and self.callee_name(s, func.func) == "operator.attrgetter":
            keys = [
                a.value
                for a in func.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str)
            ]
            if len(keys) != len(func.args) or not node.args:
                for a in node.args:
                    if self.sections(self.expr(s, a, "attrbase")):
                        self.error(node, "attrgetter with keys that are not constants")
                return EMPTY
            out: set[str] = set()
            for base in self.expr(s, node.args[0], "attrbase"):
                for key in keys:
                    cur = {base}
                    for part in key.split("."):
                        cur = (
                            set().union(*(self.member(s, node, p, part, "attrbase") for p in cur))
                            if cur
                            else set()
                        )
                    out |= cur
            return self.use(out, ctx, node)
        if isinstance(func, ast.Attribute):
            self._bound = []
            fpaths = self.expr(s, func, "callee")
            bound, self._bound = self._bound, []
            if bound or fpaths:
                out = set()
                for cls, name, path in bound:
                    out |= self.expand(cls, self.schema.classes[cls].methods[name], path, node)
                self.args(s, node, "value")
                return self.use(out, ctx, node)
        else:
            self.expr(s, func, "callee")
        if qual in ("builtins.getattr", "builtins.hasattr") and node.args:
            bases = self.sections(self.expr(s, node.args[0], "attrbase"))
            for a in node.args[1:]:
                self.expr(s, a)
            if not bases:
                return EMPTY
            name = node.args[1] if len(node.args) > 1 else None
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                names = {name.value}
            elif isinstance(name, ast.Name) and s.lookup_strs(name.id):
                names = s.lookup_strs(name.id) or set()
            else:
                self.error(
                    node, f"{short} on a config section with a name the analysis cannot tell"
                )
                return EMPTY
            out = set()
            for p in bases:
                for n in sorted(names):
                    out |= self.member(s, node, p, n, "attrbase")
            return self.use(out, "presence" if short == "hasattr" else ctx, node)
        if qual in ("dataclasses.asdict", "dataclasses.astuple", "builtins.vars"):
            self.args(s, node, "whole")
            return EMPTY
        if qual == "dataclasses.replace" and node.args:
            out = set(self.expr(s, node.args[0], "alias"))
            for a in node.args[1:]:
                self.expr(s, a)
            for kw in node.keywords:
                self.expr(s, kw.value, "alias")
            return self.use(out, ctx, node)
        if qual and qual.startswith("builtins.") and short in BUILTIN_PRESENCE:
            self.args(s, node, "presence")
            return EMPTY
        site = (
            self.module.name,
            s.function_name(),
            ast.unparse(func) if not isinstance(func, ast.Call) else "",
        )
        if site in SITES:
            kind, _why = SITES[site]
            if self.recording:
                self.index.used_sites.add(site)
            self.args(s, node, "whole" if kind == "whole" else "alias")
            return EMPTY
        # a package function: each config section passed must land on a parameter
        # annotated with its schema type (the callee's reads are counted in its module)
        cands, bound = self.candidates(s, func, qual)
        found = self.index.lookup(qual) if qual else None
        dc = found if isinstance(found, ClassInfo) and not cands and found.is_dataclass else None
        # a function handed to a Callable-annotated parameter or field is bound, not run:
        # it runs where the slot is called (below)
        positions, names = self.callable_params(cands, bound, dc)
        passed = []
        for i, a in enumerate(node.args):
            self._no_refs += i in positions
            paths = self.sections(self.expr(s, a, "arg"))
            self._no_refs -= i in positions
            if paths:
                passed.append((i, None, paths, a))
        for kw in node.keywords:
            self._no_refs += kw.arg in names
            paths = self.sections(self.expr(s, kw.value, "arg"))
            self._no_refs -= kw.arg in names
            if paths:
                passed.append((None, kw.arg, paths, kw.value))
        what = ast.unparse(func)[:60]
        slots = (
            self.slots(s, func, qual)
            if not cands and dc is None and (qual is None or qual.startswith("param:"))
            else []
        )
        if self.recording:
            for _owner, _ann, bindings in slots:
                for m, value in bindings:
                    self.ref(self.binding_target(m, value))
        for i, kw, paths, a in passed:
            if isinstance(a, ast.Starred) or kw is None and i is None:
                self.error(a, f"config section(s) {sorted(paths)} passed by * or ** to {what}")
                continue
            if dc is not None:
                fields = self.dataclass_fields(dc)
                fld = (
                    fields[i]
                    if i is not None and i < len(fields)
                    else next((f for f in fields if f.target.id == kw), None)
                )
                anns = [(dc.qual, fld.annotation if fld else None)]
            elif slots:
                for owner, ann, bindings in slots:
                    self.check_slot(a, owner, ann, bindings, i, kw, paths)
                continue
            elif cands:
                anns = []
                for c in cands:
                    a_ = c.node.args
                    params = [*a_.posonlyargs, *a_.args]
                    if bound and c.kind != "static":
                        params = params[1:]
                    if i is not None:
                        p = params[i] if i < len(params) else None
                    else:
                        p = next((x for x in [*params, *a_.kwonlyargs] if x.arg == kw), None)
                    anns.append((c.qual, p.annotation if p is not None else None))
            else:
                self.error(
                    a,
                    f"config section(s) {sorted(paths)} passed to {what}, which the "
                    "analysis cannot follow (outside the package, or unresolved)",
                )
                continue
            for callee, ann in anns:
                cls = (
                    self.index.schema_class(
                        self.index.module(callee.rsplit(".", 1)[0]) or self.module, ann
                    )
                    if ann is not None
                    else None
                )
                if cls is None:
                    cls = self._schema_class_in(callee, ann)
                if cls is None or not all(
                    self.schema.is_subclass(self.schema.type_at(p), cls) for p in paths
                ):
                    self.error(
                        a,
                        f"config section(s) {sorted(paths)} passed to {callee}, whose "
                        f"parameter is not annotated with its schema type "
                        f"({ast.unparse(ann) if ann is not None else 'no annotation'})",
                    )
        # the return value: a schema annotation places it
        out = set()
        for c in cands:
            if isinstance(found, ClassInfo):
                continue
            cls = self._schema_class_in(c.qual, c.node.returns)
            if cls is not None:
                locs = self.schema.locations(cls)
                if len(locs) != 1:
                    self.error(node, f"{c.qual} returns {cls}, which sits at {locs}")
                out |= set(locs)
        return self.use(out, ctx, node)

    def slots(
        self, s: Scope, func: ast.expr, qual: str | None
    ) -> list[tuple[str, ast.expr, list[tuple[Module, ast.expr]]]]:
        """A call through a Callable-annotated parameter or dataclass field: (owner,
        its annotation, every value the package binds to it)."""
        out: list[tuple[str, ast.expr, list[tuple[Module, ast.expr]]]] = []
        if qual and qual.startswith("param:"):
            found = s.find_param(qual[6:])
            assert found is not None
            scope, arg = found
            if scope.func is None or arg.annotation is None:
                return []
            fn = scope.func.node
            every = [*fn.args.posonlyargs, *fn.args.args]
            bindings: list[tuple[Module, ast.expr]] = []
            dflts = dict(
                zip(
                    [a.arg for a in every][len(every) - len(fn.args.defaults) :],
                    fn.args.defaults,
                    strict=True,
                )
            )
            dflts.update(
                {
                    a.arg: d
                    for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True)
                    if d is not None
                }
            )
            if arg.arg in dflts and not (
                isinstance(dflts[arg.arg], ast.Constant) and dflts[arg.arg].value is None
            ):
                bindings.append((self.module, dflts[arg.arg]))
            pos = [a.arg for a in every].index(arg.arg) if arg in every else None
            if scope.func.kind in ("method", "class") and pos is not None:
                pos -= 1
            for m, call in self.index.calls_to(scope.func):
                bindings += [(m, v) for v in self._bound_value(call, pos, arg.arg)]
            out.append((scope.func.qual + f"({arg.arg})", arg.annotation, bindings))
        elif isinstance(func, ast.Attribute):
            for d, k, f in self.index.callable_fields(func.attr):
                bindings = [
                    (cm, v)
                    for cm, call in self.index.calls_to(d)
                    for v in self._bound_value(call, k, func.attr)
                ]
                if f.value is not None:
                    bindings.append((d.module, f.value))
                out.append((f"{d.qual}.{func.attr}", f.annotation, bindings))
        return out

    def callable_params(
        self, cands: list[Func], bound: bool, dc: ClassInfo | None
    ) -> tuple[set[int], set[str]]:
        """The argument positions and names a call binds to Callable-annotated
        parameters (or dataclass fields)."""
        positions: set[int] = set()
        names: set[str] = set()
        if dc is not None:
            for k, f in enumerate(self.dataclass_fields(dc)):
                if _is_callable(f.annotation):
                    positions.add(k)
                    names.add(f.target.id)
        for c in cands:
            params = [*c.node.args.posonlyargs, *c.node.args.args]
            if bound and c.kind != "static":
                params = params[1:]
            for k, p in enumerate(params):
                if _is_callable(p.annotation):
                    positions.add(k)
                    names.add(p.arg)
            names.update(p.arg for p in c.node.args.kwonlyargs if _is_callable(p.annotation))
        return positions, names

    def binding_target(self, m: Module, value: ast.expr) -> Func | None:
        d = _dotted(value)
        if d is None:
            return None
        head, _, rest = d.partition(".")
        found = self.index.lookup(m.qualify(head) + (f".{rest}" if rest else ""))
        return found if isinstance(found, Func) else None

    @staticmethod
    def _bound_value(call: ast.Call, pos: int | None, name: str) -> list[ast.expr]:
        vals = [kw.value for kw in call.keywords if kw.arg == name]
        if (
            pos is not None
            and pos < len(call.args)
            and not any(isinstance(a, ast.Starred) for a in call.args[: pos + 1])
        ):
            vals.append(call.args[pos])
        return vals

    def check_slot(
        self,
        at: ast.AST,
        owner: str,
        ann: ast.expr,
        bindings: list[tuple[Module, ast.expr]],
        i: int | None,
        kw: str | None,
        paths: set[str],
    ) -> None:
        """A section passed through ``Callable[[..., T, ...], R]``: T must be its schema
        type, and every function the package binds to the slot must take it annotated so
        (its reads are then counted in its own module: the binding names it, so its module
        is in the closure of whoever binds it)."""
        owner_mod = self.index.module(owner.split("(")[0].rsplit(".", 1)[0]) or self.module
        while owner_mod is None or owner_mod.name not in self.index.modules:
            owner_mod = self.module
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            ann = ast.parse(ann.value, mode="eval").body
        argtypes = None
        if (
            isinstance(ann, ast.Subscript)
            and (_dotted(ann.value) or "").endswith("Callable")
            and isinstance(ann.slice, ast.Tuple)
            and isinstance(ann.slice.elts[0], ast.List)
        ):
            argtypes = ann.slice.elts[0].elts
        want = None
        if argtypes is not None and kw is None and i is not None and i < len(argtypes):
            want = self._schema_class_in(owner.split("(")[0], argtypes[i])
        if want is None or not all(
            self.schema.is_subclass(self.schema.type_at(p), want) for p in paths
        ):
            self.error(
                at,
                f"config section(s) {sorted(paths)} passed through {owner}, "
                f"annotated {ast.unparse(ann)}: not its schema type at that place",
            )
            return
        if not bindings:
            self.error(at, f"{owner}: no function of the package is bound to it")
        for m, value in bindings:
            target = self.binding_target(m, value)
            if target is None:
                self.error(
                    at,
                    f"{owner} is bound to {ast.unparse(value)[:40]} "
                    f"({m.rel}:{value.lineno}), which the analysis cannot resolve",
                )
                continue
            params = [*target.node.args.posonlyargs, *target.node.args.args]
            p = params[i] if i < len(params) else None
            cls = self.index.schema_class(target.module, p.annotation if p else None)
            if cls is None or not all(
                self.schema.is_subclass(self.schema.type_at(q), cls) for q in paths
            ):
                self.error(
                    at,
                    f"{owner} is bound to {target.qual}, whose parameter {i} is "
                    "not annotated with the section's schema type",
                )
                continue

    def _schema_class_in(self, callee_qual: str, ann: ast.expr | None) -> str | None:
        """Resolve an annotation in the callee's own module."""
        if ann is None:
            return None
        parts = callee_qual.split(".")
        for i in range(len(parts), 0, -1):
            m = self.index.module(".".join(parts[:i]))
            if m is not None:
                return self.index.schema_class(m, ann)
        return None

    def args(self, s: Scope, node: ast.Call, ctx: str) -> None:
        for a in node.args:
            self.expr(s, a.value if isinstance(a, ast.Starred) else a, ctx)
        for kw in node.keywords:
            self.expr(s, kw.value, ctx)


# --------------------------------------------------------------------------- comparison


def stage_reads(index: Index, modules: set[str], entry: str) -> tuple[list[Read], list[str]]:
    """The reads of the functions a stage may run: from the module-level code of every
    module of its import closure and the ``__main__`` block of ``entry`` (and of modules
    run as scripts, named in strings), through every function or class referred to (a
    class: all its methods; ``x.name`` on an object of unknown type: every method of that
    name in the closure; a Callable slot: what the package binds to it)."""
    mods = {m.rstrip(".") for m in modules if module_file(m.rstrip("."), index.src) is not None}
    by_owner: dict[str, list[Read]] = {}
    refs: dict[str, set[tuple[str, str]]] = {}
    errors: list[str] = []
    for mod in sorted(mods):
        an = index.analysis(mod)
        r, e = index.reads(mod)
        for read in r:
            by_owner.setdefault(read.owner, []).append(read)
        for owner, rs in an.refs.items():
            refs.setdefault(owner, set()).update(rs)
        errors += [x for x in e if x not in errors]
    classes = {
        d.qual: d for m in mods for d in index.module(m).defs.values() if isinstance(d, ClassInfo)
    }
    methods: dict[str, list[str]] = {}
    for ci in classes.values():
        for name, f in ci.methods.items():
            methods.setdefault(name, []).append(f.qual)

    def in_closure(qual: str) -> bool:
        return any(qual.startswith(m + ".") for m in mods)

    todo = [f"{m}:<module>" for m in mods] + [f"{entry}:__main__"]
    reached: set[str] = set()
    while todo:
        owner = todo.pop()
        if owner in reached or owner in NOT_READS:
            continue
        reached.add(owner)
        for kind, value in refs.get(owner, ()):
            if kind == "func" and in_closure(value):
                todo.append(value)
            elif kind == "class" and value in classes:
                todo += [f.qual for f in classes[value].methods.values()]
                todo += [
                    q
                    for base in _bases(index, classes[value])
                    for q in (f.qual for f in base.methods.values())
                ]
            elif kind == "name":
                todo += methods.get(value, [])
            elif kind == "entry" and value in mods:
                todo.append(f"{value}:__main__")
    reads = [r for owner in reached for r in by_owner.get(owner, [])]
    return reads, errors


def _bases(index: Index, ci: ClassInfo) -> list[ClassInfo]:
    out = []
    for b in ci.node.bases:
        d = _dotted(b)
        if d is None:
            continue
        head, _, rest = d.partition(".")
        found = index.lookup(ci.module.qualify(head) + (f".{rest}" if rest else ""))
        if isinstance(found, ClassInfo):
            out += [found, *_bases(index, found)]
    return out


def declared_keys(spec: dict) -> list[str]:
    """A stage's ``params:`` entries (params.yaml keys)."""
    out: list[str] = []
    for entry in spec.get("params", []) or []:
        if isinstance(entry, str):
            out.append(entry)
        elif isinstance(entry, dict):
            for file, keys in entry.items():
                assert file == "params.yaml", f"params from {file}: not analysed"
                out += list(keys or [])
    return out


def _under(key: str, top: str) -> bool:
    return key == top or key.startswith(top + ".")


def compare(
    stage: str, reads: list[Read], declared: list[str], templated: set[str], schema: Schema
) -> list[str]:
    """What dvc.yaml's ``params:`` of ``stage`` misses or lists in vain, one line each."""
    problems: list[str] = []
    for key in declared:
        if not schema.is_key(key):
            problems.append(f"{stage}: lists {key}, which is not a config key")
        else:
            nulled = [key.rsplit(".", i)[0] for i in range(1, key.count(".") + 1)]
            for sec in nulled:
                if schema.nullable(sec):
                    problems.append(
                        f"{stage}: lists {key}, under {sec}, which may be null "
                        f"(then DVC misses the key): list {sec} instead"
                    )
    covered = set(declared) | templated
    by_key: dict[str, list[Read]] = {}
    for r in reads:
        by_key.setdefault((r.key, r.kind), []).append(r)
    for (key, kind), rs in sorted(by_key.items()):
        ok = any(_under(key, c) for c in covered)
        if not ok:
            problems.append(
                f"{stage}: reads {key} ({kind}, e.g. {rs[0].where}) but dvc.yaml does not list it"
            )
    # every leaf a declared entry stands for must be read (a leaf, or a section tested
    # or consumed whole at or above it)
    leaf_reads = {r.key for r in reads if r.kind == "leaf"}
    section_reads = {r.key for r in reads if r.kind != "leaf"}
    for key in declared:
        if not schema.is_key(key):
            continue
        unread = sorted(
            leaf
            for leaf in schema.leaves(key)
            if leaf not in leaf_reads and not any(_under(leaf, sec) for sec in section_reads)
        )
        if (
            unread
            and unread == sorted(schema.leaves(key))
            and not any(_under(sec, key) for sec in section_reads)
        ):
            problems.append(f"{stage}: lists {key}, which its code never reads")
        elif unread:
            problems.append(f"{stage}: lists {key}, but its code never reads {', '.join(unread)}")
    return problems
