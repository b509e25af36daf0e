"""The names OpenAI's and Whisper's answers give the languages of Whisper's language tokens
(``"en"`` is ``"english"``): what ``verbose_json``'s ``language`` holds."""

from __future__ import annotations

__all__ = ["language_code", "language_name"]

_TABLE = (
    "en english zh chinese de german es spanish ru russian ko korean fr french ja japanese "
    "pt portuguese tr turkish pl polish ca catalan nl dutch ar arabic sv swedish it italian "
    "id indonesian hi hindi fi finnish vi vietnamese he hebrew uk ukrainian el greek "
    "ms malay cs czech ro romanian da danish hu hungarian ta tamil no norwegian th thai "
    "ur urdu hr croatian bg bulgarian lt lithuanian la latin mi maori ml malayalam cy welsh "
    "sk slovak te telugu fa persian lv latvian bn bengali sr serbian az azerbaijani "
    "sl slovenian kn kannada et estonian mk macedonian br breton eu basque is icelandic "
    "hy armenian ne nepali mn mongolian bs bosnian kk kazakh sq albanian sw swahili "
    "gl galician mr marathi pa punjabi si sinhala km khmer sn shona yo yoruba so somali "
    "af afrikaans oc occitan ka georgian be belarusian tg tajik sd sindhi gu gujarati "
    "am amharic yi yiddish lo lao uz uzbek fo faroese ht haitian_creole ps pashto "
    "tk turkmen nn nynorsk mt maltese sa sanskrit lb luxembourgish my myanmar bo tibetan "
    "tl tagalog mg malagasy as assamese tt tatar haw hawaiian ln lingala ha hausa "
    "ba bashkir jw javanese su sundanese yue cantonese"
)
_WORDS = _TABLE.split()
NAMES: dict[str, str] = {
    code: name.replace("_", " ") for code, name in zip(_WORDS[::2], _WORDS[1::2], strict=True)
}
"""Whisper's language code -> its name."""

# other names transformers' Whisper takes for some of them
_ALIASES = {
    "burmese": "my", "valencian": "ca", "flemish": "nl", "haitian": "ht",
    "letzeburgesch": "lb", "pushto": "ps", "panjabi": "pa", "moldavian": "ro",
    "moldovan": "ro", "sinhalese": "si", "castilian": "es", "mandarin": "zh",
}  # fmt: skip
_CODES: dict[str, str] = {**{name: code for code, name in NAMES.items()}, **_ALIASES}


def language_name(code: str) -> str:
    """The name of a Whisper language code (``"en"`` -> ``"english"``); a code Whisper does
    not name is given back as it is."""
    return NAMES.get(code, code)


def language_code(language: str) -> str:
    """Whisper's code of ``language``, a code or a name in any case (``"French"``,
    ``"mandarin"``), as transformers' Whisper takes it; a code it does not know as given."""
    return _CODES.get(language.lower(), language)
