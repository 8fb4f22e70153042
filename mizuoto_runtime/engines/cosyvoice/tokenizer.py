"""CosyVoice's text tokenizer: the checkpoint's Qwen2 byte-level BPE (``CosyVoice-BlankEN/``)
with the special tokens upstream's ``CosyVoice2Tokenizer`` / ``CosyVoice3Tokenizer`` add, in
their order (new ids follow ``<|im_end|>``; ``<|endofprompt|>`` is the first of them)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import CheckpointError

ENDOFPROMPT = "<|endofprompt|>"
# The additional special tokens, in upstream's order (the ids depend on it).
_V2 = ("<|im_start|> <|im_end|> <|endofprompt|> [breath] <strong> </strong> [noise] [laughter] [cough] "
       "[clucking] [accent] [quick_breath] <laughter> </laughter> [hissing] [sigh] [vocalized-noise] "
       "[lipsmack] [mn]").split()
_ARPABET = ("AA AA0 AA1 AA2 AE AE0 AE1 AE2 AH AH0 AH1 AH2 AO AO0 AO1 AO2 AW AW0 AW1 AW2 AY AY0 AY1 AY2 B CH D DH "
            "EH EH0 EH1 EH2 ER ER0 ER1 ER2 EY EY0 EY1 EY2 F G HH IH IH0 IH1 IH2 IY IY0 IY1 IY2 JH K L M N NG OW "
            "OW0 OW1 OW2 OY OY0 OY1 OY2 P R S SH T TH UH UH0 UH1 UH2 UW UW0 UW1 UW2 V W Y Z ZH").split()
_PINYIN = ("a ai an ang ao b c ch d e ei en eng f g h i ian in ing iu ià iàn iàng iào iá ián iáng iáo iè ié "
           "iòng ióng iù iú iā iān iāng iāo iē iě iōng iū iǎ iǎn iǎng iǎo iǒng iǔ j k l m n o ong ou p q r s "
           "sh t u uang ue un uo uà uài uàn uàng uá uái uán uáng uè ué uì uí uò uó uā uāi uān uāng uē uě uī "
           "uō uǎ uǎi uǎn uǎng uǐ uǒ vè w x y z zh à ài àn àng ào á ái án áng áo è èi èn èng èr é éi én éng "
           "ér ì ìn ìng í ín íng ò òng òu ó óng óu ù ùn ú ún ā āi ān āng āo ē ēi ēn ēng ě ěi ěn ěng ěr ī īn "
           "īng ō ōng ōu ū ūn ǎ ǎi ǎn ǎng ǎo ǐ ǐn ǐng ǒ ǒng ǒu ǔ ǔn ǘ ǚ ǜ").split()
_V3 = _V2 + ["<|endofsystem|>"] + [f"[{p}]" for p in _ARPABET] + [f"[{p}]" for p in _PINYIN]


def special_tokens(version: int) -> list[str]:
    return list(_V2 if version == 2 else _V3)


class TextTokenizer:
    """``encode(text) -> ids`` and ``decode(ids) -> text`` (special tokens skipped)."""

    def __init__(self, folder: str | Path, version: int) -> None:
        from transformers import AutoTokenizer

        folder = Path(folder)
        try:
            self.tokenizer: Any = AutoTokenizer.from_pretrained(str(folder))
        except (OSError, ValueError, TypeError) as exc:
            raise CheckpointError(f"{folder}: cannot load the Qwen2 tokenizer ({exc})") from exc
        self.tokenizer.add_special_tokens({"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                                           "additional_special_tokens": special_tokens(version)})
        self.version = version

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer([text])["input_ids"][0])

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.batch_decode([ids], skip_special_tokens=True)[0])

    def token_id(self, token: str) -> int:
        return int(self.tokenizer.convert_tokens_to_ids(token))

    def __len__(self) -> int:
        return len(self.tokenizer)
