"""tfm_course.data.corpus: the stdlib-docstring corpus (ranges, not exact counts: it varies by Python)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter

import pytest

from tfm_course.data import corpus


def test_size_and_split_are_in_range():
    docs = corpus.stdlib_docstrings()
    n_chars = sum(len(d.text) for d in docs)
    assert 5_000 < len(docs) < 15_000 and 1_000_000 < n_chars < 3_000_000, (len(docs), n_chars)
    train, valid = corpus.documents("train"), corpus.documents("validation")
    assert len(train) + len(valid) == len(docs) and corpus.documents("all") == docs
    modules = {d.module for d in docs}
    held_out = {d.module for d in valid}
    assert 0.05 < len(held_out) / len(modules) < 0.2  # 10 % of the modules, by hash
    assert 0.05 < sum(len(d.text) for d in valid) / n_chars < 0.3
    assert corpus.text("validation") == "\n\n".join(d.text for d in valid)


def test_a_module_lives_in_one_split_chosen_by_a_stable_hash():
    by_module: dict[str, set[str]] = {}
    for d in corpus.stdlib_docstrings():
        by_module.setdefault(d.module, set()).add(d.split)
    assert all(len(splits) == 1 for splits in by_module.values())
    # sha256 of the dotted path: the same on every machine and every Python (golden values)
    assert corpus.split_of("json") == "validation" and corpus.split_of("json.decoder") == "train"
    assert corpus.split_of("inspect") == "validation" and corpus.split_of("os") == "train"
    fraction = Counter(corpus.split_of(f"pkg.module_{i}") for i in range(20_000))["validation"] / 20_000
    assert abs(fraction - corpus.VALIDATION_FRACTION) < 0.01


def test_filters_leave_no_boilerplate_and_the_report_adds_up():
    docs = corpus.stdlib_docstrings()
    texts = [d.text for d in docs]
    assert len(set(texts)) == len(texts), "exact duplicates are kept once"
    assert all(len(t.split()) >= 2 for t in texts)
    assert not any(corpus.LICENCE.search(t) for t in texts)
    assert not any(corpus.GENERATED_CODEC.search(t) for t in texts)
    assert not any(d.module.split(".")[0] == "test" or ".tests" in d.module for d in docs)
    r = corpus.filter_report()
    dropped = (r["generated codec headers dropped"] + r["shorter than two words dropped"]
               + r["duplicates dropped"])
    assert r["docstrings found"] - dropped == r["docstrings kept"] == len(docs)
    assert r["characters kept"] == sum(map(len, texts))
    for rule in ("licence paragraphs removed", "generated codec headers dropped", "duplicates dropped"):
        assert r[rule] > 0, f"{rule}: a rule that removes nothing needs no justification"


def test_docstrings_of_names_nested_definitions():
    source = textwrap.dedent('''
        """Module doc."""
        if True:
            class A:
                """Class A."""
                def f(self):
                    """Method f."""
                    def inner():
                        """Inner."""
            async def g():
                """Coroutine g."""
        try:
            def h():
                "h doc"
        except ImportError:
            pass
        def no_doc():
            return 1
        ''')
    assert corpus.docstrings_of(source) == [("", "Module doc."), ("A", "Class A."), ("A.f", "Method f."),
                                            ("A.f.inner", "Inner."), ("g", "Coroutine g."), ("h", "h doc")]


def test_strip_licence_keeps_the_prose():
    text = "Useful summary.\n\nMore prose here.\n\n(c) Copyright CNRI, All Rights Reserved. NO WARRANTY."
    assert corpus.strip_licence(text) == ("Useful summary.\n\nMore prose here.", 1)
    assert corpus.strip_licence("Print the license text.") == ("Print the license text.", 0)


def test_module_name(tmp_path):
    (tmp_path / "email" / "mime").mkdir(parents=True)
    assert corpus.module_name(tmp_path / "email" / "mime" / "text.py", tmp_path) == "email.mime.text"
    assert corpus.module_name(tmp_path / "email" / "__init__.py", tmp_path) == "email"


def test_bad_split():
    with pytest.raises(ValueError, match="split must be one of"):
        corpus.documents("test")


def test_collection_imports_nothing_and_the_disk_cache_round_trips(tmp_path):
    """In a fresh process: collect (cold), check no stdlib module was imported, collect again (warm)."""
    script = textwrap.dedent("""
        import json, sys, time
        from tfm_course.data import corpus
        start = time.perf_counter()
        docs = corpus.stdlib_docstrings()
        seconds = time.perf_counter() - start
        imported = sorted(m for m in ("tkinter", "turtle", "idlelib", "turtledemo", "lib2to3", "curses", "smtplib")
                          if m in sys.modules)
        print(json.dumps({"n": len(docs), "seconds": seconds, "imported": imported,
                          "first": docs[0].path, "last": docs[-1].text}))
        """)
    env = dict(os.environ, TFM_COURSE_CACHE=str(tmp_path))
    runs = [json.loads(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                      check=True, timeout=120).stdout) for _ in range(2)]
    cold, warm = runs
    assert cold["imported"] == [], "collecting must never import the modules it reads"
    assert len(list(tmp_path.glob("stdlib-docstrings-*.json"))) == 1
    assert (warm["n"], warm["first"], warm["last"]) == (cold["n"], cold["first"], cold["last"])
    assert cold["seconds"] < 60 and warm["seconds"] < cold["seconds"]


def test_cache_dir_setting(monkeypatch, tmp_path):
    for off in ("off", "0", "false", ""):
        monkeypatch.setenv("TFM_COURSE_CACHE", off)
        assert corpus.cache_dir() is None
    monkeypatch.setenv("TFM_COURSE_CACHE", str(tmp_path))
    assert corpus.cache_dir() == tmp_path
    monkeypatch.delenv("TFM_COURSE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert corpus.cache_dir() == tmp_path / "xdg" / "tfm_course"


FAKE = [corpus.Docstring("fake.module", "", "A fake docstring, collected."),
        corpus.Docstring("fake.module", "f", "Another fake docstring.")]


@pytest.fixture
def fake_collection(monkeypatch, tmp_path):
    """A disk cache in tmp_path and a cheap stand-in for the real collection, which counts its calls."""
    calls = []

    def collect(root=None):
        calls.append(root)
        return list(FAKE), {"docstrings kept": len(FAKE)}

    monkeypatch.setenv("TFM_COURSE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(corpus, "collect", collect)
    monkeypatch.setattr(corpus, "_collected", {})
    corpus._corpus.cache_clear()
    yield calls
    corpus._corpus.cache_clear()  # the next caller reads the real corpus again


def _reload() -> list[corpus.Docstring]:
    corpus._corpus.cache_clear()  # a new process: only the disk cache is left
    return corpus.stdlib_docstrings()


def test_a_stale_or_damaged_disk_cache_is_never_read(fake_collection, tmp_path):
    assert corpus.stdlib_docstrings() == FAKE and len(fake_collection) == 1
    (path,) = (tmp_path / "cache").glob("stdlib-docstrings-*.json")
    assert _reload() == FAKE and len(fake_collection) == 1, "a sound cache is read, not collected again"
    good = path.read_text(encoding="utf-8")
    data = json.loads(good)

    forged = dict(data, documents=[["fake.module", "", "Forged text, valid JSON."]] + data["documents"][1:])
    stale = dict(data, key="another-python-or-another-corpus-py")
    damaged = {"edited text, old checksum": json.dumps(forged),
               "written for another key": json.dumps(stale),
               "truncated": good[: len(good) // 2],
               "not an object": "[1, 2, 3]",
               "no checksum": json.dumps({k: v for k, v in data.items() if k != "sha256"}),
               "not UTF-8": b"\xff\xfe\x00 garbage"}
    for n, (what, content) in enumerate(damaged.items(), start=2):
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        assert _reload() == FAKE, what
        assert len(fake_collection) == n, f"{what}: the cache was read instead of collecting again"
        assert json.loads(path.read_text(encoding="utf-8")) == data, f"{what}: the cache was not rewritten"


def test_the_corpus_works_without_a_usable_disk_cache(fake_collection, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TFM_COURSE_CACHE", str(blocker / "cache"))  # cannot be created
    assert _reload() == FAKE and _reload() == FAKE and len(fake_collection) == 2
    assert blocker.read_text() == "not a folder" and not list(tmp_path.glob("**/*.tmp*"))
    monkeypatch.setenv("TFM_COURSE_CACHE", "off")
    assert _reload() == FAKE and len(fake_collection) == 3
