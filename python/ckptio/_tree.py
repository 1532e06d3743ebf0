"""Pytrees: flattening a state into named leaves, and building it back.

A state is a tree of dicts, lists and tuples; everything else is a leaf
(see _leaves.py), except None (an empty subtree) and str (a constant kept in
the tree definition, not stored as a leaf). A leaf's name is its key path as
eformer spells it: dict keys and sequence indices joined with "."
({"layers": [{"w": x}]} names x "layers.0.w"). A key may itself hold "."
(torch's state_dict keys do: "0.weight"), which names the leaf as the nested
form would; the tree definition keeps the real keys, and two leaves that end
up with the same name are refused (InvalidArgument "... appears twice").

Prefixes: by default the state is a dict whose top-level keys are the
checkpoint's prefixes (eformer's "model", "tx"), and each value's key paths
are the leaf paths under it. With prefix="model" the whole state goes under
that one prefix. A leaf sitting directly at a prefix (a top-level value
that is itself a leaf, as in {"step": 5}) has the path "value".

The tree definition (what is needed to build the same tree back: container
types, dict keys with their types, None and str nodes, and whether a leaf was
an array, a tensor or a Python scalar) is stored in the step's metadata under
TREE_KEY, as a flat list of nodes in preorder, so that its JSON nesting does
not grow with the tree's depth:
  ["d", [keys...]]  a dict; its children follow in key order
  ["l", n] / ["u", n]  a list / tuple of n children
  ["n"]  None; ["s", text]  a string;  [kind]  a leaf (kinds in _leaves.py)
"""

from . import errors

TREE_KEY = "ckptio.python_tree"
TREE_VERSION = 1
TOP_LEAF_PATH = "value"


def _join(path, key):
    return f"{path}.{key}" if path else key


def _key_text(key, where):
    if isinstance(key, bool) or not isinstance(key, (str, int)):
        raise errors.InvalidArgument(f"{where}: key {key!r} is a {type(key).__name__}; keys must be str or int")
    text = str(key)
    if not text:
        raise errors.InvalidArgument(f"{where}: an empty key cannot name a leaf")
    return text


def flatten(state, prefix, on_leaf, kind_of):
    """Walks `state`; calls on_leaf(prefix, path, obj, kind) for every leaf, in
    order. Returns the tree definition (a JSON-able dict)."""
    nodes = []

    def walk(node, pfx, path):
        if isinstance(node, dict):
            keys = list(node.keys())
            texts = [_key_text(k, f"{pfx}/{path}" if path else pfx) for k in keys]
            nodes.append(["d", keys])
            for k, t in zip(keys, texts):
                walk(node[k], pfx, _join(path, t))
        elif isinstance(node, (list, tuple)):
            nodes.append(["l" if isinstance(node, list) else "u", len(node)])
            for i, child in enumerate(node):
                walk(child, pfx, _join(path, str(i)))
        elif node is None:
            nodes.append(["n"])
        elif isinstance(node, str):
            nodes.append(["s", node])
        else:
            leaf_path = path or TOP_LEAF_PATH
            kind = kind_of(node)
            if kind is None:
                raise errors.InvalidArgument(
                    f"leaf '{pfx}/{leaf_path}': a {type(node).__module__}.{type(node).__qualname__} is not a "
                    "leaf ckptio can save (numpy arrays, torch CPU tensors, Python and numpy scalars, "
                    "objects with __array__ or the buffer protocol) nor a dict, list or tuple")
            nodes.append([kind])
            on_leaf(pfx, leaf_path, node, kind)

    # walk refers to itself through its closure, a cycle that would keep
    # on_leaf (and through it the caller's arrays) alive until the garbage
    # collector runs: cut when done.
    try:
        if prefix is None:
            if not isinstance(state, dict):
                raise errors.InvalidArgument(
                    f"the state must be a dict whose keys are the checkpoint's prefixes (\"model\", "
                    f"\"tx\", ...), not a {type(state).__name__}; or pass prefix=\"name\"")
            keys = list(state.keys())
            for k in keys:
                if not isinstance(k, str) or not k:
                    raise errors.InvalidArgument(f"prefix {k!r}: the state's top-level keys must be non-empty str")
            nodes.append(["d", keys])
            for k in keys:
                walk(state[k], k, "")
        else:
            if not isinstance(prefix, str) or not prefix:
                raise errors.InvalidArgument(f"prefix must be a non-empty str, not {prefix!r}")
            walk(state, prefix, "")
    finally:
        del walk
    return {"version": TREE_VERSION, "prefix": prefix, "nodes": nodes}


MISSING = object()


def unflatten(tree, lookup):
    """Builds the tree `tree` describes; lookup(prefix, path, kind) gives each
    leaf's value, or MISSING for a leaf that was not restored (a selection):
    dicts then leave its key out, sequences hold None in its place, and a
    container left with nothing is left out itself."""
    nodes = iter(tree["nodes"])

    def build(pfx, path):
        node = next(nodes)
        tag = node[0]
        if tag == "d":
            out = {}
            for k in node[1]:
                v = build(pfx, _join(path, str(k)))
                if v is not MISSING:
                    out[k] = v
            return out if out or not node[1] else MISSING
        if tag in ("l", "u"):
            items = [build(pfx, _join(path, str(i))) for i in range(node[1])]
            if items and all(v is MISSING for v in items):
                return MISSING
            items = [None if v is MISSING else v for v in items]
            return items if tag == "l" else tuple(items)
        if tag == "n":
            return None
        if tag == "s":
            return node[1]
        return lookup(pfx, path or TOP_LEAF_PATH, tag)

    # build refers to itself through its closure, a cycle that would keep
    # lookup (and through it every restored array) alive until the garbage
    # collector runs, whatever the caller drops: cut when done.
    try:
        prefix = tree.get("prefix")
        if prefix is not None:
            out = build(prefix, "")
            return None if out is MISSING else out
        top = next(nodes)
        out = {}
        for k in top[1]:
            v = build(k, "")
            if v is not MISSING:
                out[k] = v
        return out
    finally:
        del build


def tree_from_paths(leaves):
    """Nested dicts from (prefix, path, value) triples, for steps saved without a
    tree definition (by C++ or the CLI): {prefix: {"a": {"b": value}}} for
    the path "a.b". A path that is both a leaf and the parent of others keeps
    the others under their full remaining path."""
    out = {}
    for prefix, path, value in leaves:
        node = out.setdefault(prefix, {})
        parts = path.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):  # a leaf here already: keep the rest of the path whole
                node = None
                out[prefix][path] = value
                break
            node = child
        if node is not None:
            if parts[-1] in node:  # a dict here already (leaf "a" after "a.b"): keep the path whole
                out[prefix][path] = value
            else:
                node[parts[-1]] = value
    return out
