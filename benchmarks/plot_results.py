"""Bar plots of a run_all.py result file (needs matplotlib).

Kept apart from run_all.py so that the benchmarks run in an environment
without matplotlib and the plot is drawn by any Python that has it:

  python benchmarks/plot_results.py results.json out.png
"""
from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import json
import sys


def plot(results, png_path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  est = results.get('estimator', {}).get('summary', {})
  red = results.get('reduction', {}).get('summary', {})
  models = results.get('estimator', {}).get('models', ['wide', 'deep'])
  configs = results.get('estimator', {}).get('configs', [])
  labels = results.get('estimator', {}).get('labels', {})
  fig, axes = plt.subplots(1, 3, figsize=(18, 7))
  # Up to 20 configurations get colours of their own (the default cycle
  # repeats after 10).
  colours = plt.get_cmap('tab20').colors

  # 1 + 2: throughput and graph build, relative to single device.
  for ax, metric, title, better in (
      (axes[0], 'examples_per_s', 'Training throughput vs single device',
       'higher is better'),
      (axes[1], 'graph_build_s', 'Graph construction time vs single device',
       'lower is better')):
    width = 0.8 / max(1, len(configs))
    for i, config in enumerate(configs):
      xs, ys = [], []
      for j, model in enumerate(models):
        base = est.get('{}/single'.format(model), {}).get(metric)
        val = est.get('{}/{}'.format(model, config), {}).get(metric)
        if base and val:
          xs.append(j + (i - (len(configs) - 1) / 2.0) * width)
          ys.append(val / base)
      bars = ax.bar(xs, ys, width, label=labels.get(config, config),
                    color=colours[i % len(colours)])
      for x, y in zip(xs, ys):
        ax.text(x, y, '{:.2f}'.format(y), ha='center', va='bottom',
                fontsize=7)
      del bars
    ax.axhline(1.0, color='grey', lw=0.8, ls='--')
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels(models)
    ax.set_ylabel('ratio to single device ({})'.format(better))
    ax.set_title(title)
  # One legend for both panels, below them, so that it hides no bar.
  handles, names = axes[0].get_legend_handles_labels()
  fig.legend(handles, names, loc='lower left', ncol=3, fontsize=7,
             bbox_to_anchor=(0.01, 0.01))

  # 3: reductions, ms, log scale.
  impls = results.get('reduction', {}).get('impls', [])
  sets = ['wide', 'small']
  width = 0.8 / 2
  xs_all = []
  for k, set_name in enumerate(sets):
    xs, ys = [], []
    for i, impl in enumerate(impls):
      v = red.get('{}/{}'.format(set_name, impl), {})
      if v.get('status') == 'ok':
        xs.append(i + (k - 0.5) * width)
        ys.append(v['ms'])
    axes[2].bar(xs, ys, width, label='{} set'.format(set_name))
    xs_all.extend(xs)
  axes[2].set_yscale('log')
  axes[2].set_xticks(range(len(impls)))
  axes[2].set_xticklabels(impls, rotation=60, ha='right', fontsize=6)
  axes[2].set_ylabel('ms per batch_reduce (lower is better)')
  axes[2].set_title('4-way reduction on virtual CPUs')
  axes[2].legend(fontsize=7)
  fig.suptitle('replicate benchmarks: {}'.format(results.get('when', '')),
               fontsize=10)
  fig.tight_layout(rect=(0, 0.2, 1, 1))
  fig.savefig(png_path, dpi=110)


def main(argv):
  if len(argv) != 3:
    print(__doc__)
    return 2
  with open(argv[1]) as f:
    results = json.load(f)
  plot(results, argv[2])
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
