"""`--mode=help`: every config key with its value and its line of documentation.

The documentation is the config files' own: experiments/wmt_ende_base.py defines every key
beside a comment saying what it is (and the paper's section), under `# ----- Group -----`
headings, and the configs built on it (big, demo) add their own. Reading those comments
keeps one home for each key's meaning instead of a second copy to keep in step.
"""
from __future__ import annotations

import io
import os
import re
import tokenize
from collections.abc import Iterator

import ml_collections

from t2t_jax.config import loading

BASE = os.path.join(loading.EXPERIMENTS, 'wmt_ende_base.py')
_GROUP = re.compile(r'#\s*-{3,}\s*(.*?)\s*-{3,}\s*$')
_ASSIGNMENT = re.compile(r'\s*config\.([\w.]+)\s*=')
_SENTENCE_END = re.compile(r'(?<=\.)\s')
_LONGEST = 110  # characters of a doc on its line


def documented_keys(path: str) -> Iterator[tuple[str, str, str]]:
  """(group, key, doc) of each `config.KEY = ...` line of a config file, in file order.

  A key's doc is the comment on its line, else the comment block just above it; the first
  sentence of it. Its group is the `# ----- Group -----` heading above it ('' before any).
  A file that cannot be read or tokenized documents nothing.
  """
  try:
    with open(path, encoding='utf-8') as f:
      source = f.read()
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
  except (OSError, SyntaxError, tokenize.TokenError):
    return
  comments: dict[int, str] = {}
  code_lines: set[int] = set()
  for token in tokens:
    if token.type == tokenize.COMMENT:
      comments[token.start[0]] = token.string
    elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
      code_lines.update(range(token.start[0], token.end[0] + 1))
  group, block = '', []  # block: the comment lines just above the current line
  for number, line in enumerate(source.splitlines(), start=1):
    comment = comments.get(number, '')
    heading = _GROUP.match(comment)
    if heading and number not in code_lines:
      group, block = heading.group(1), []
    elif number not in code_lines:  # a comment line, or a blank one
      block = [*block, comment.lstrip('# ').rstrip()] if comment else []
    else:
      assignment = _ASSIGNMENT.match(line)
      if assignment:
        own = comment.lstrip('# ').rstrip()
        yield group, assignment.group(1), first_sentence(own or ' '.join(block))
      block = []


def first_sentence(text: str) -> str:
  """The first sentence of `text`, cut at _LONGEST characters."""
  sentence = _SENTENCE_END.split(text.strip(), maxsplit=1)[0] if text else ''
  return sentence if len(sentence) <= _LONGEST else sentence[:_LONGEST - 2].rstrip() + ' …'


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
    group = docs[key][0] if key in docs else 'Other keys'
    doc = docs[key][1] if key in docs else ''
    line = f'  {key} = {values[key]!r}'
    groups.setdefault(group or 'Other keys', []).append(f'{line}  # {doc}' if doc else line)
  text = [f'Config keys (--config.KEY=VALUE), their values here, and what each is; '
          f'{os.path.relpath(files[0])} says more.']
  for group, lines in groups.items():
    text += ['', group, *lines]
  return '\n'.join(text) + '\n'
