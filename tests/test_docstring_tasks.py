"""tfm_course.data.docstring_tasks: the class-or-function task (labels, balance, held-out modules)."""

from __future__ import annotations

import ast
import inspect
import json.decoder
from collections import Counter

import pytest

from tfm_course.data import corpus
from tfm_course.data.docstring_tasks import CLASS_OR_FUNCTION_LABELS, class_or_function, kinds


def test_labels_are_the_kind_of_definition_in_the_source():
    k = kinds()
    assert k["json.decoder", "JSONDecoder"] == "class"
    assert k["json.decoder", "JSONDecoder.decode"] == "function"
    assert k["contextlib", "suppress"] == "class"  # lower case, yet a class: not the naming guess
    assert k["codecs", "EncodedFile"] == "function"  # CapWords, yet a function
    # every named docstring of the corpus has a kind
    named = [(d.module, d.name) for d in corpus.documents("all") if d.name]
    assert all(key in k for key in named)


def test_a_label_matches_its_text():
    texts, labels = class_or_function("train", balance=False)
    by_text = dict(zip(texts, labels))
    doc = inspect.cleandoc(json.decoder.JSONDecoder.__doc__)
    if doc in by_text:  # the same Python's source: the class docstring is labelled "class"
        assert CLASS_OR_FUNCTION_LABELS[by_text[doc]] == "class"
    source = (corpus.stdlib_root() / "json" / "decoder.py").read_bytes()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and ast.get_docstring(node) in by_text:
            want = "class" if isinstance(node, ast.ClassDef) else "function"
            assert CLASS_OR_FUNCTION_LABELS[by_text[ast.get_docstring(node)]] == want


@pytest.mark.parametrize("split", corpus.SPLITS)
def test_each_split_is_balanced_and_keeps_every_class_docstring(split):
    texts, labels = class_or_function(split)
    counts = Counter(labels)
    assert counts[0] == counts[1] > 100 and len(texts) == len(labels)
    all_texts, all_labels = class_or_function(split, balance=False)
    assert counts[1] == Counter(all_labels)[1] < Counter(all_labels)[0]  # classes are the fewer
    assert set(texts) <= set(all_texts)
    docs = {d.text: d for d in corpus.documents(split)}
    assert all(docs[t].name for t in texts)  # no module docstring


def test_validation_modules_are_held_out():
    train_texts, _ = class_or_function("train", balance=False)
    valid_texts, _ = class_or_function("validation", balance=False)
    module_of = {d.text: d.module for d in corpus.documents("all")}
    assert not {module_of[t] for t in train_texts} & {module_of[t] for t in valid_texts}


def test_the_seed_chooses_the_sample_and_nothing_else_does():
    first, again, other = (class_or_function("train", seed=s) for s in (0, 0, 1))
    assert first == again
    assert first[0] != other[0] and sorted(first[1]) == sorted(other[1])
    classes = {t for t, y in zip(*first) if y == 1}
    assert classes == {t for t, y in zip(*other) if y == 1}  # every class docstring, both times


def test_bad_split_is_refused():
    with pytest.raises(ValueError, match="split must be one of"):
        class_or_function("test")
    with pytest.raises(ValueError, match="split must be one of"):
        class_or_function("all")
