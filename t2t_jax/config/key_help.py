"""`--mode=help`: every config key with its value and its line of documentation, read from
the config files' own comments (experiments/wmt_ende_base.py documents every key under
`# ----- Group -----` headings; the configs built on it add their own), so that each key's
meaning has one home, not a second copy to keep in step.
"""
from __future__ import annotations

import io
import os
import re
import textwrap
import tokenize
from collections.abc import Iterator

import ml_collections

from t2t_jax.config import loading

BASE = os.path.join(loading.EXPERIMENTS, 'wmt_ende_base.py')
_GROUP = re.compile(r'#\s*-{3,}\s*(.*?)\s*-{3,}\s*$')
_ASSIGNMENT = re.compile(r'\s*config\.([\w.]+)\s*=')
_SENTENCE_END = re.compile(r'(?<=\.)\s')
_WIDTH = 100  # a longer line is wrapped, its doc continued under its '#'


def documented_keys(path: str) -> Iterator[tuple[str, str, str]]:
  """(group, key, doc) of each `config.KEY = ...` line of a config file, in file order: doc is
  the first sentence of the comment on its line, else of the comment block just above it;
  group, the heading above it ('' before any). An unreadable file documents nothing."""
  try:
    with open(path, encoding='utf-8') as f:
      source = f.read()
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
  except (OSError, SyntaxError, tokenize.TokenError):
    return
  comments = {t.start[0]: t.string for t in tokens if t.type == tokenize.COMMENT}
  not_code = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
  code_lines = {n for t in tokens if t.type not in not_code
                for n in range(t.start[0], t.end[0] + 1)}
  group, block = '', []  # block: the comment lines just above the current line
  for number, line in enumerate(source.splitlines(), start=1):
    comment = comments.get(number, '')
    text = comment.lstrip('# ').rstrip()
    if number in code_lines:
      assignment = _ASSIGNMENT.match(line)
      if assignment:
        yield group, assignment.group(1), first_sentence(text or ' '.join(block))
      block = []
    elif heading := _GROUP.match(comment):
      group, block = heading.group(1), []
    else:  # a comment line, or a blank one
      block = [*block, text] if comment else []


def first_sentence(text: str) -> str:
  """The first sentence of `text`, whole."""
  return _SENTENCE_END.split(text.strip(), maxsplit=1)[0]


def _documented(line: str, doc: str) -> list[str]:
  """`line  # doc`, wrapped at _WIDTH with the doc's next lines under its '#'."""
  if not doc:
    return [line]
  indent = ' ' * min(len(line) + 2, 40) + '# '
  return textwrap.wrap(f'{line}  # {doc}', _WIDTH, subsequent_indent=indent,
                       break_long_words=False, break_on_hyphens=False)


def _flat(config: ml_collections.ConfigDict, prefix: str = '') -> Iterator[tuple[str, object]]:
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      yield from _flat(value, f'{prefix}{key}.')
    else:
      yield f'{prefix}{key}', value


def describe(config: ml_collections.ConfigDict, files: tuple[str, ...] = (BASE,)) -> str:
  """The text --mode=help prints: `config`'s keys grouped, each `KEY = VALUE  # doc`, the
  docs from `files` (the first to document a key wins), the keys they don't name last."""
  docs: dict[str, tuple[str, str]] = {}
  for path in files:
    for group, key, doc in documented_keys(path):
      if key not in docs or not docs[key][1]:
        docs[key] = (group, doc)
  values = dict(_flat(config))
  groups: dict[str, list[str]] = {}
  for key in [k for k in docs if k in values] + [k for k in values if k not in docs]:
    group, doc = docs.get(key, ('', ''))
    line = f'  {key} = {values[key]!r}'
    groups.setdefault(group or 'Other keys', []).extend(_documented(line, doc))
  text = [f'Config keys (--config.KEY=VALUE), their values here, and what each is; '
          f'{os.path.relpath(files[0])} says more.']
  for group, lines in groups.items():
    text += ['', group, *lines]
  return '\n'.join(text) + '\n'
