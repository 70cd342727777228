"""Which language a reply is in, offline and without a model: by script, then stopwords.

Languages with their own script are recognised by the share of letters in it (Cyrillic
for ru/uk/bg, Greek, Arabic for ar/fa/ur, Hebrew, Devanagari for hi/mr/ne, Bengali, Tamil,
Telugu, Thai, Hangul, kana for ja, Han for zh). Latin-script languages (en, fr, de, es,
it, pt, nl) by their most frequent function words: the asked language must have the most
hits and at least 8% of the words. Any other language code cannot be checked offline, and
a check of it fails (fail closed), saying so.
"""

from __future__ import annotations

import re
import unicodedata

_SCRIPTS: dict[str, tuple[str, ...]] = {
    "ru": ("CYRILLIC",), "uk": ("CYRILLIC",), "bg": ("CYRILLIC",), "el": ("GREEK",),
    "ar": ("ARABIC",), "fa": ("ARABIC",), "ur": ("ARABIC",), "he": ("HEBREW",),
    "hi": ("DEVANAGARI",), "mr": ("DEVANAGARI",), "ne": ("DEVANAGARI",), "bn": ("BENGALI",),
    "ta": ("TAMIL",), "te": ("TELUGU",), "th": ("THAI",), "ko": ("HANGUL",),
    "ja": ("HIRAGANA", "KATAKANA", "CJK"), "zh": ("CJK",),
}  # fmt: skip
_STOPWORDS: dict[str, frozenset[str]] = {
    lang: frozenset(words.split())
    for lang, words in {
        "en": "the and of to is in that it was for on are with as his they be at this have from or by not but what all were we when your can said there use an each which she do how their if will up other about out many then them these so some her would make like him into has look two more write go see number no way could people my than first been who its now find",
        "fr": "le la les de des du un une et est en que qui dans pour pas sur au aux avec ce cette il elle ils nous vous je tu sont mais ou donc par plus se sa son ses leur ont été être avoir fait comme tout très bien",
        "de": "der die das und ist nicht ein eine zu den von mit sich des auf für im dem auch es an als wie er sie wir ihr sind aber oder noch nach bei einer einem wird werden hat haben kann über nur schon",
        "es": "el la los las de del y en que es un una por con para no se su sus al lo como más pero o este esta son está muy también fue ha hay ya sin sobre entre cuando todo",
        "it": "il lo la i gli le di del della e è un una che in per con non si da al alla come più ma anche sono questo questa ha hanno molto tutto dei delle nel nella",
        "pt": "o a os as de do da dos das e é um uma que em para com não se por no na mais mas como ao foi são está muito também seu sua ele ela isso",
        "nl": "de het een en van is dat in op te zijn niet met voor er ook aan maar als bij dit die wordt worden nog wel om naar dan heeft hebben kan",
    }.items()
}  # fmt: skip
_WORD = re.compile(r"[^\W\d_]+")
MIN_SCRIPT_SHARE = 0.6
MIN_STOPWORD_SHARE = 0.08


def checkable(code: str) -> bool:
    return code in _SCRIPTS or code in _STOPWORDS


def _script(ch: str) -> str:
    name = unicodedata.name(ch, "")
    if name.startswith("CJK"):
        return "CJK"
    return name.split(" ", 1)[0]


def is_language(text: str, code: str) -> tuple[bool, str]:
    """(True, why) when ``text`` is in language ``code`` as far as this module can tell."""
    code = code.lower().split("-")[0]
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return False, "no letters"
    if code in _SCRIPTS:
        wanted = _SCRIPTS[code]
        share = sum(_script(c) in wanted for c in letters) / len(letters)
        if code == "zh" and any(_script(c) in ("HIRAGANA", "KATAKANA") for c in letters):
            return False, "kana present: Japanese, not Chinese"
        return share >= MIN_SCRIPT_SHARE, f"{share:.0%} of letters in its script"
    if code not in _STOPWORDS:
        return False, f"language {code!r} cannot be checked offline"
    if sum(_script(c) == "LATIN" for c in letters) / len(letters) < MIN_SCRIPT_SHARE:
        return False, "mostly not Latin script"
    words = [w.lower() for w in _WORD.findall(text)]
    hits = {lang: sum(w in stop for w in words) for lang, stop in _STOPWORDS.items()}
    best = max(hits, key=lambda lang: hits[lang])
    share = hits[code] / len(words)
    if best != code and hits[best] > hits[code]:
        return False, f"reads as {best} ({hits[best]} function words vs {hits[code]})"
    return share >= MIN_STOPWORD_SHARE, f"{share:.0%} function words of {code}"
