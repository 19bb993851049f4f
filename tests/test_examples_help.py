"""Every flag of the examples says what it does in `--help`."""
import os
import re
import subprocess
import sys

from absl.testing import parameterized
import tensorflow as tf

_EXAMPLES = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'examples')


def _flag_help(text):
  """{'--flag': its help text} from argparse's `--help` output."""
  helps = {}
  flag = None
  for line in text.splitlines():
    match = re.match(r'^  (-\w, )?(--[\w-]+)( [A-Z_]+)?(\s{2,}(.*))?$', line)
    if match:
      flag = match.group(2)
      helps[flag] = (match.group(5) or '').strip()
    elif flag and line.startswith(' ' * 10) and line.strip():
      helps[flag] = (helps[flag] + ' ' + line.strip()).strip()
    else:
      flag = None
  return helps


class ExamplesHelpTest(parameterized.TestCase, tf.test.TestCase):

  @parameterized.parameters('digits_demo.py', 'local_cluster.py')
  def test_every_flag_has_help(self, script):
    output = subprocess.run(
        [sys.executable, os.path.join(_EXAMPLES, script), '--help'],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120,
        check=True, universal_newlines=True).stdout
    helps = _flag_help(output)
    helps.pop('--help', None)
    self.assertGreaterEqual(len(helps), 2, output)
    self.assertEqual([], [flag for flag, text in helps.items() if not text],
                     output)


if __name__ == '__main__':
  tf.test.main()
