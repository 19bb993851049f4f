"""Edits of an op's `NodeDef` as it becomes a copy on another device."""

_SEED2_STRIDE = 1000003  # a prime: seed2 + i * stride differs per copy


def colocation_targets(node_def):
  """Names of the ops a `NodeDef` is colocated with (its `_class` attr)."""
  if '_class' not in node_def.attr:
    return []
  prefix = b'loc:@'
  return [g[len(prefix):].decode() for g in node_def.attr['_class'].list.s
          if g.startswith(prefix)]


def rename_colocation(node, prefix, copied):
  """Colocates a copy with the copies of the ops its original was with.

  Colocation with an op that is not copied (e.g. a variable) is dropped: the
  copy's device is set explicitly to that op's.
  """
  if '_class' not in node.attr:
    return
  groups = node.attr['_class'].list.s
  tag = b'loc:@'
  kept = [tag + prefix.encode() + g[len(tag):] for g in groups
          if g.startswith(tag) and g[len(tag):].decode() in copied]
  if kept:
    del groups[:]
    groups.extend(kept)
  else:
    del node.attr['_class']


def offset_seed(node, tower_id):
  """Gives a seeded random op of copy `tower_id` its own `seed2`."""
  if 'seed' not in node.attr or 'seed2' not in node.attr:
    return
  if not node.attr['seed'].i and not node.attr['seed2'].i:
    return  # Unseeded: every op draws its own numbers already.
  node.attr['seed2'].i = (node.attr['seed2'].i +
                          tower_id * _SEED2_STRIDE) % (1 << 31)
