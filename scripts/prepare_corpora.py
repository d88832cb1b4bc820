"""Prepare real long texts for evaluation into a local data directory (default: data/corpora).

    python scripts/prepare_corpora.py [--out data/corpora] [--corpus kjv wiki]

kjv   King James Bible (public domain; Debian's bible-kjv, installed with apt-get if missing),
      verse numbers stripped: the long-book corpus (PG-19 stand-in), ~1M tokens.
wiki  English Wikipedia articles from gensim's test data (the gensim wheel is downloaded with
      pip, not installed), wiki markup stripped to plain prose.

Each corpus is written as NAME.txt atomically; token counts for the default model's tokenizer
are printed and stored in corpora.json.
"""
from __future__ import annotations

import argparse
import bz2
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GENSIM_WHEEL = "gensim==4.4.0"
WIKI_MEMBER = ("gensim/test/test_data/"
               "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")


def kjv_text() -> str:
    if shutil.which("bible") is None:
        subprocess.run(["apt-get", "install", "-y", "-q", "bible-kjv"], check=True)
    raw = subprocess.run(["bible", "-l100000", "Gen1:1-Rev22:21"], check=True,
                         capture_output=True, text=True).stdout
    lines = []
    for line in raw.splitlines():
        line = line.strip()
        if not line:
            continue
        verse = re.match(r"^\d+ (.*)$", line)
        # chapter headings ("Genesis 1") become paragraph breaks; verses lose their numbers
        lines.append(verse.group(1) if verse else f"\n{line}\n")
    return "\n".join(lines).strip() + "\n"


def strip_wiki_markup(text: str) -> str:
    for _ in range(3):  # nested templates / tables unwrap from the inside out
        text = re.sub(r"\{\{[^{}]*\}\}", "", text)
        text = re.sub(r"\{\|[^{}]*?\|\}", "", text, flags=re.S)
    text = re.sub(r"<ref[^>/]*/>", "", text)
    text = re.sub(r"<ref.*?</ref>", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"\[\[(?:File|Image|Category):[^\[\]]*(?:\[\[[^\]]*\]\][^\[\]]*)*\]\]", "", text)
    text = re.sub(r"\[\[[a-z\-]{2,12}:[^\]]*\]\]", "", text)  # interlanguage links
    text = re.sub(r"\[\[(?:[^\]|]*\|)?([^\]]*)\]\]", r"\1", text)
    text = re.sub(r"\[https?://[^\s\]]+ ?([^\]]*)\]", r"\1", text)
    text = re.sub(r"'{2,}", "", text)
    text = re.sub(r"^=+\s*(.*?)\s*=+\s*$", r"\n\1\n", text, flags=re.M)
    text = re.sub(r"^[*#:;]+\s*", "", text, flags=re.M)
    text = re.sub(r"^\s*[|!].*$", "", text, flags=re.M)
    text = text.replace("&nbsp;", " ").replace("&amp;", "&").replace("&quot;", '"')
    text = re.sub(r"[ \t]+", " ", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def wiki_text() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp,
                        GENSIM_WHEEL], check=True)
        wheel = glob.glob(os.path.join(tmp, "gensim-*.whl"))[0]
        with zipfile.ZipFile(wheel) as z:
            xml = bz2.decompress(z.read(WIKI_MEMBER)).decode("utf-8")
    articles = []
    for page in re.findall(r"<page>(.*?)</page>", xml, flags=re.S):
        title = re.search(r"<title>(.*?)</title>", page).group(1)
        body = re.search(r"<text[^>]*>(.*?)</text>", page, flags=re.S)
        if body is None or ":" in title:
            continue
        import html
        plain = strip_wiki_markup(html.unescape(body.group(1)))
        if plain.upper().startswith("#REDIRECT") or len(plain) < 2000:
            continue
        articles.append(f"{title}\n\n{plain}")
    return "\n\n".join(articles) + "\n"


CORPORA = {"kjv": kjv_text, "wiki": wiki_text}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "data" / "corpora"))
    p.add_argument("--corpus", nargs="+", choices=list(CORPORA), default=list(CORPORA))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    from engine.loading.default_model import default_checkpoint
    from engine.loading.files import write_atomic
    from engine.loading.tokenizer import load_tokenizer
    tokenizer = load_tokenizer(default_checkpoint())

    index_path = out / "corpora.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    for name in args.corpus:
        text = CORPORA[name]()
        write_atomic(out / f"{name}.txt", text)
        n = len(tokenizer.encode(text))
        index[name] = {"file": f"{name}.txt", "chars": len(text), "tokens": n}
        print(f"{name}: {out / (name + '.txt')} ({len(text):,} chars, {n:,} tokens)")
    write_atomic(index_path, json.dumps(index, indent=2) + "\n")


if __name__ == "__main__":
    main()
