"""The package's shape: layers import only downwards, no cycles, small modules.

Reads the import statements of every module of `replicate/` (imports inside
functions count: a lazy import is still a dependency) and checks the rules
that docs/architecture.md states. Nothing of the package is imported.
"""
import ast
import os

import tensorflow as tf

_PACKAGE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'replicate')

# What each subpackage may import besides itself (the base modules
# `replicate.errors` and `replicate._compat` are open to all).
_ALLOWED = {
    'core': set(),
    'cross_tower': {'core'},
    'gradients': {'core'},
    'graph_copy': {'core'},
    'towers': {'core', 'gradients', 'graph_copy'},
    'strategy': {'core', 'cross_tower', 'gradients', 'graph_copy'},
    'cluster': {'core', 'towers'},
}
_BASE = {'replicate.errors', 'replicate._compat', 'replicate.version'}
_MAX_LINES = 500
_MAX_TOP_LEVEL_MODULES = 15


def _modules():
  """{dotted module name: path} for every module of the package."""
  found = {}
  root = os.path.dirname(_PACKAGE)
  for folder, _, files in os.walk(_PACKAGE):
    for name in files:
      if name.endswith('.py'):
        path = os.path.join(folder, name)
        dotted = os.path.relpath(path, root)[:-3].replace(os.sep, '.')
        if dotted.endswith('.__init__'):
          dotted = dotted[:-len('.__init__')]
        found[dotted] = path
  return found


def _imports(path, known):
  """The package's modules that the module at `path` imports."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      candidates = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      candidates = [node.module] + [
          node.module + '.' + alias.name for alias in node.names]
    else:
      continue
    for candidate in candidates:
      while candidate and candidate not in known:
        candidate = candidate.rpartition('.')[0]
      if candidate:
        out.add(candidate)
  return out


def _layer(module):
  """The subpackage of `module`, or None for a top-level module."""
  parts = module.split('.')
  return parts[1] if len(parts) > 2 or (
      len(parts) == 2 and parts[1] in _ALLOWED) else None


class ArchitectureTest(tf.test.TestCase):

  def setUp(self):
    super(ArchitectureTest, self).setUp()
    self.modules = _modules()
    self.graph = {name: _imports(path, self.modules) - {name}
                  for name, path in self.modules.items()}

  def test_subpackages_import_only_lower_layers(self):
    wrong = []
    for module, imported in sorted(self.graph.items()):
      layer = _layer(module)
      if layer is None:
        continue  # Facades and base modules may import any layer.
      allowed = _ALLOWED[layer] | {layer}
      for target in sorted(imported):
        if target in _BASE or target == 'replicate':
          continue
        target_layer = _layer(target)
        if target_layer not in allowed:
          wrong.append('{} imports {}'.format(module, target))
    self.assertEqual([], wrong, 'imports that go up or sideways')

  def test_base_modules_import_nothing_of_the_package(self):
    for module in _BASE:
      self.assertEqual(set(), self.graph[module], module)

  def test_no_import_cycles(self):
    # Depth-first search for a back edge.
    state = {}
    cycles = []

    def visit(module, path):
      state[module] = 'open'
      for target in sorted(self.graph[module]):
        if target == 'replicate':
          continue  # Only tests and users import the package itself.
        if state.get(target) == 'open':
          cycles.append(path[path.index(target):] + [target])
        elif target not in state:
          visit(target, path + [target])
      state[module] = 'done'

    for module in sorted(self.graph):
      if module not in state:
        visit(module, [module])
    self.assertEqual([], cycles)

  def test_modules_are_small(self):
    long_modules = {}
    for module, path in self.modules.items():
      with open(path) as f:
        lines = sum(1 for _ in f)
      if lines > _MAX_LINES:
        long_modules[module] = lines
    self.assertEqual({}, long_modules)

  def test_few_modules_at_the_top(self):
    top = [m for m in self.modules
           if m.count('.') == 1 and m.split('.')[1] not in _ALLOWED]
    self.assertLessEqual(len(top), _MAX_TOP_LEVEL_MODULES, sorted(top))

  def test_every_subpackage_says_what_it_holds_and_may_import(self):
    for layer in _ALLOWED:
      init = os.path.join(_PACKAGE, layer, '__init__.py')
      with open(init) as f:
        docstring = ast.get_docstring(ast.parse(f.read()))
      self.assertIsNotNone(docstring, layer)
      self.assertIn('May import', docstring, layer)


if __name__ == '__main__':
  tf.test.main()
