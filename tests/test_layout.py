"""The package layout of docs/architecture.md, checked on the real import graph of jaxwebrl/.

Every `import` of every module under jaxwebrl/ (at module level and inside functions, relative ones resolved)
must point down the layers, never up or sideways (inside env/: tasks -> browser -> agent, never back); a
function-local import must say why it is local (a comment on its line or just above its block: an import cycle it
breaks, or a heavy/optional dependency it defers); and the trainer's update step must import without pyzmq,
Selenium or TensorStore (bench/device_check.py runs it on an accelerator image that lacks pyzmq); and no module
passes 500 lines (a module has one job)."""

import ast
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "jaxwebrl")

# docs/architecture.md: a node imports only nodes of a lower rank (or itself).
RANK = {
    "errors": 0, "extensions": 0, "files": 0, "seeds": 0,
    "rl": 1, "parallel": 1,
    "env": 2, "buffer": 2, "models": 2,
    "rollout": 3, "checkpoint": 3,
    "train": 4, "eval": 4, "plan": 4,
    "cli": 5, "lab": 5,
}
# Inside env/ (docs/architecture.md): a subpackage imports only subpackages of a lower rank (or itself). The
# agent's language is at the bottom (the browser carries out its Actions, the tasks use both); the top-level
# modules of env/ (base, registry, latency, check) are the interface and the places that compose the three.
ENV_RANK = {"agent": 0, "browser": 1, "tasks": 2}
# Intra-package imports of models/ (the lead's package) are left to its owner: their local imports carry no
# reason comments yet. Everything else follows the rule.
LOCAL_IMPORT_RULE_EXEMPT = ("jaxwebrl/models/",)
MAX_MODULE_LINES = 500


def _modules():
    for root, _, files in os.walk(PACKAGE):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                rel = os.path.relpath(path, REPO)
                module = rel[:-3].replace(os.sep, ".")
                yield path, rel, module[: -len(".__init__")] if module.endswith(".__init__") else module


def _node(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "jaxwebrl"


def _imports(path: str, module: str):
    """(line, imported jaxwebrl module, inside a function, the import node) for every import of jaxwebrl."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    is_package = path.endswith("__init__.py")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                names = [".".join(base + ([node.module] if node.module else []))]
            else:
                names = [node.module]
        else:
            continue
        up, in_function = node, False
        while up in parents:
            up = parents[up]
            if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)):
                in_function = True
                break
        for name in names:
            yield node.lineno, name, in_function, node


def test_imports_point_down_the_layers():
    unknown, wrong = set(), []
    for path, rel, module in _modules():
        source = _node(module)
        if source != "jaxwebrl" and source not in RANK:
            unknown.add(source)
        for line, name, in_function, _ in _imports(path, module):
            if not name or not name.startswith("jaxwebrl"):
                continue
            target = _node(name)
            if target == source or target == "jaxwebrl" and name == "jaxwebrl":
                continue
            if target not in RANK:
                unknown.add(target)
            elif source in RANK and RANK[target] >= RANK[source]:
                where = "inside a function" if in_function else "at module level"
                wrong.append(f"{rel}:{line}: {source} (layer {RANK[source]}) imports {name} (layer {RANK[target]}) "
                             f"{where}")
    assert not unknown, f"packages with no layer: {sorted(unknown)}: place them in RANK and docs/architecture.md"
    assert not wrong, "imports that point up or sideways (docs/architecture.md):\n" + "\n".join(wrong)


def _env_subpackage(module: str) -> str | None:
    """"agent" for jaxwebrl.env.agent and jaxwebrl.env.agent.prompt; None outside env/ and for env/'s top-level
    modules (base, registry, ...)."""
    parts = module.split(".")
    if len(parts) < 3 or parts[:2] != ["jaxwebrl", "env"]:
        return None
    return parts[2] if os.path.isdir(os.path.join(PACKAGE, "env", parts[2])) else None


def test_env_subpackages_import_in_their_direction():
    unknown, wrong = set(), []
    for path, rel, module in _modules():
        source = _env_subpackage(module)
        if source is None:
            continue
        if source not in ENV_RANK:
            unknown.add(source)
            continue
        for line, name, in_function, _ in _imports(path, module):
            target = _env_subpackage(name or "")
            if target is None or target == source:
                continue
            if target not in ENV_RANK:
                unknown.add(target)
            elif ENV_RANK[target] > ENV_RANK[source]:
                where = "inside a function" if in_function else "at module level"
                wrong.append(f"{rel}:{line}: env/{source} imports {name} (env/{target} is above it) {where}")
    assert not unknown, (f"env subpackages with no rank: {sorted(unknown)}: place them in ENV_RANK and "
                         "docs/architecture.md")
    assert not wrong, "env/ imports against agent -> browser -> tasks (docs/architecture.md):\n" + "\n".join(wrong)


def test_the_agent_imports_nothing_of_env_outside_it():
    """env/agent is the bottom of env/: besides agent -> browser -> tasks, it imports none of env/'s top-level
    modules either (registry and families compose the tasks; the action grammar gets its action texts passed in)."""
    wrong = []
    for path, rel, module in _modules():
        if _env_subpackage(module) != "agent":
            continue
        for line, name, in_function, _ in _imports(path, module):
            if name and name.startswith("jaxwebrl.env") and _env_subpackage(name) != "agent":
                wrong.append(f"{rel}:{line}: env/agent imports {name}")
    assert not wrong, "env/agent imports above it (docs/architecture.md):\n" + "\n".join(wrong)


def test_no_module_passes_500_lines():
    long = []
    for path, rel, _ in _modules():
        with open(path, encoding="utf-8") as f:
            lines = len(f.read().splitlines())
        if lines > MAX_MODULE_LINES:
            long.append(f"{rel}: {lines} lines")
    assert not long, (f"modules over {MAX_MODULE_LINES} lines (a module has one job: split it by job):\n"
                      + "\n".join(long))


def test_every_function_local_import_says_why():
    missing = []
    for path, rel, module in _modules():
        if rel.startswith(LOCAL_IMPORT_RULE_EXEMPT):
            continue
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            up = node
            while up in parents and not isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)):
                up = parents[up]
            if not isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            first = node.lineno   # the first line of the block of imports this one belongs to
            while first > 1 and lines[first - 2].strip().startswith(("import ", "from ")):
                first -= 1
            said = "#" in lines[node.lineno - 1] or "#" in lines[first - 1] or \
                (first > 1 and lines[first - 2].strip().startswith("#"))
            if not said:
                missing.append(f"{rel}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not missing, ("function-local imports without the reason (a cycle it breaks, or a heavy/optional "
                         "dependency it defers) in a comment:\n" + "\n".join(missing))


def test_the_update_step_imports_without_pyzmq_selenium_or_tensorstore():
    """What bench/device_check.py imports on an accelerator image: the import fails if any of them is reached."""
    script = (
        "import importlib.abc, sys\n"
        "BLOCKED = ('zmq', 'selenium', 'tensorstore')\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in BLOCKED:\n"
        "            raise ImportError(f'{name} is not installed on this image')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import jaxwebrl.train.update, jaxwebrl.train.assembly, jaxwebrl.models.presets, jaxwebrl.parallel.cost\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in BLOCKED))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"
