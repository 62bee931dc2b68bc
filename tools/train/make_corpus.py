#!/usr/bin/env python3
"""The training corpus of anvil's default model, from two Debian packages (run on a Debian machine,
not the GPU machine, which has no apt):

    apt-get install -y bible-kjv fortunes      # bible-kjv brings bible-kjv-text and the `bible` reader
    python3 tools/train/make_corpus.py OUT_DIR

  - the King James Bible (public domain): `bible-kjv-text` stores it compressed in
    /usr/lib/bible.data; the `bible` program of `bible-kjv` prints it one verse per line
    ("Ge1:1 In the beginning ..."). Each chapter becomes one document: a heading line
    ("Genesis 1") and then its verses, one per line, without their numbers.
  - the `fortunes` and `fortunes-min` collections (/usr/share/games/fortunes): each fortune is one
    document; ASCII-art files and a few files of jokes about groups of people are left out;
    fortunes with broken UTF-8 are skipped;
    overstrike sequences ("_\\b") are removed, runs of spaces and tabs become one space, blank
    lines inside a fortune are dropped.

Documents never contain a blank line, so files hold them separated by exactly one blank line.
Every 20th chapter and every 20th fortune (index % 20 == 19, counted separately) are held out.

Writes, all deterministic (the same packages give the same bytes):
  train.txt          the training documents (chapters, then fortunes)
  heldout.txt        the held-out documents
  heldout-small.txt  ~24 KB of held-out documents (chapters spread over the Bible, then fortunes):
                     the text the perplexity conformance test scores, committed as
                     tests/data/default-model/heldout-small.txt
  corpus.json        counts, sizes and sha256 of the files
"""
import hashlib
import json
import os
import re
import subprocess
import sys

FORTUNE_DIR = "/usr/share/games/fortunes"
FORTUNE_SKIP = {"art", "ascii-art", "ethnic", "men-women"}
HOLD_EVERY = 20

# The `bible` program's book abbreviations, in canonical order, and the names written in headings.
BOOKS = [
    ("Ge", "Genesis"), ("Exo", "Exodus"), ("Lev", "Leviticus"), ("Num", "Numbers"),
    ("Deu", "Deuteronomy"), ("Josh", "Joshua"), ("Jdgs", "Judges"), ("Ruth", "Ruth"),
    ("1Sm", "1 Samuel"), ("2Sm", "2 Samuel"), ("1Ki", "1 Kings"), ("2Ki", "2 Kings"),
    ("1Chr", "1 Chronicles"), ("2Chr", "2 Chronicles"), ("Ezra", "Ezra"), ("Neh", "Nehemiah"),
    ("Est", "Esther"), ("Job", "Job"), ("Psa", "Psalms"), ("Prv", "Proverbs"),
    ("Eccl", "Ecclesiastes"), ("SSol", "Song of Solomon"), ("Isa", "Isaiah"), ("Jer", "Jeremiah"),
    ("Lam", "Lamentations"), ("Eze", "Ezekiel"), ("Dan", "Daniel"), ("Hos", "Hosea"),
    ("Joel", "Joel"), ("Amos", "Amos"), ("Obad", "Obadiah"), ("Jonah", "Jonah"), ("Mic", "Micah"),
    ("Nahum", "Nahum"), ("Hab", "Habakkuk"), ("Zep", "Zephaniah"), ("Hag", "Haggai"),
    ("Zec", "Zechariah"), ("Mal", "Malachi"), ("Mat", "Matthew"), ("Mark", "Mark"),
    ("Luke", "Luke"), ("John", "John"), ("Acts", "Acts"), ("Rom", "Romans"),
    ("1Cor", "1 Corinthians"), ("2Cor", "2 Corinthians"), ("Gal", "Galatians"),
    ("Eph", "Ephesians"), ("Phi", "Philippians"), ("Col", "Colossians"),
    ("1Th", "1 Thessalonians"), ("2Th", "2 Thessalonians"), ("1Tim", "1 Timothy"),
    ("2Tim", "2 Timothy"), ("Titus", "Titus"), ("Phmn", "Philemon"), ("Heb", "Hebrews"),
    ("Jas", "James"), ("1Pet", "1 Peter"), ("2Pet", "2 Peter"), ("1Jn", "1 John"),
    ("2Jn", "2 John"), ("3Jn", "3 John"), ("Jude", "Jude"), ("Rev", "Revelation"),
]
VERSE = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")


def bible_chapters():
    """[(heading, [verse, ...])] in canonical order."""
    try:
        out = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True, capture_output=True).stdout
    except FileNotFoundError:
        sys.exit("make_corpus: the `bible` program is missing: apt-get install -y bible-kjv")
    names = dict(BOOKS)
    chapters, key = [], None
    for line in out.decode("ascii").splitlines():
        m = VERSE.match(line)
        if not m:
            sys.exit(f"make_corpus: unexpected line from `bible`: {line!r}")
        book, chapter, text = m.group(1), int(m.group(2)), " ".join(m.group(4).split())
        if book not in names:
            sys.exit(f"make_corpus: unknown book abbreviation {book!r}")
        if (book, chapter) != key:
            key = (book, chapter)
            chapters.append((f"{names[book]} {chapter}", []))
        chapters[-1][1].append(text)
    if len(chapters) != 1189:
        sys.exit(f"make_corpus: expected 1189 chapters, got {len(chapters)}")
    return chapters


def clean_fortune(text):
    text = re.sub(r".\x08", "", text)  # overstrike: "_\bX" underlines X, "X\bX" bolds it
    lines = [" ".join(line.split()) for line in text.split("\n")]
    return "\n".join(line for line in lines if line)


def fortunes():
    """Cleaned fortunes, files in name order, fortunes in file order."""
    if not os.path.isdir(FORTUNE_DIR):
        sys.exit("make_corpus: no fortunes: apt-get install -y fortunes")
    names = sorted(n for n in os.listdir(FORTUNE_DIR)
                   if "." not in n and n not in FORTUNE_SKIP and os.path.isfile(os.path.join(FORTUNE_DIR, n)))
    out = []
    for name in names:
        with open(os.path.join(FORTUNE_DIR, name), "rb") as f:
            raw = f.read().decode("utf-8", errors="replace")
        for chunk in re.split(r"\n%\n", raw.replace("\r\n", "\n")):
            text = clean_fortune(chunk.strip("%\n"))
            if text and not re.search("[\ufffd\x80-\x9f]", text):  # skip broken or double-encoded UTF-8
                out.append(text)
    return out


def write_docs(path, docs):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n\n".join(docs) + "\n")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    chapters = ["\n".join([heading] + verses) for heading, verses in bible_chapters()]
    sayings = fortunes()
    held = lambda i: i % HOLD_EVERY == HOLD_EVERY - 1
    train = [d for i, d in enumerate(chapters) if not held(i)] + [d for i, d in enumerate(sayings) if not held(i)]
    held_chapters = [d for i, d in enumerate(chapters) if held(i)]
    held_fortunes = [d for i, d in enumerate(sayings) if held(i)]
    write_docs(os.path.join(out_dir, "train.txt"), train)
    write_docs(os.path.join(out_dir, "heldout.txt"), held_chapters + held_fortunes)

    # Held-out chapters spread over the Bible (Old and New Testament) up to 16 KB, then fortunes to ~24 KB.
    small = [held_chapters[i] for i in range(0, len(held_chapters), len(held_chapters) // 4)][:5]
    while sum(len(d) + 2 for d in small) > 16000:
        small.remove(max(small, key=len))
    for d in held_fortunes:
        if sum(len(d) + 2 for d in small) + len(d) > 24000:
            break
        small.append(d)
    write_docs(os.path.join(out_dir, "heldout-small.txt"), small)

    stats = {"chapters": len(chapters), "fortunes": len(sayings),
             "train_docs": len(train), "heldout_docs": len(held_chapters) + len(held_fortunes),
             "heldout_small_docs": len(small), "files": {}}
    for name in ("train.txt", "heldout.txt", "heldout-small.txt"):
        p = os.path.join(out_dir, name)
        stats["files"][name] = {"bytes": os.path.getsize(p), "sha256": sha256(p)}
    with open(os.path.join(out_dir, "corpus.json"), "w") as f:
        json.dump(stats, f, indent=1)
    print(json.dumps(stats, indent=1))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
