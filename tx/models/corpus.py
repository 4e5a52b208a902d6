"""A built-in, deterministic training corpus for the synthetic tokenizer.

There is no model hub here, so the tokenizer that tx and the tinker client share is trained locally on this
text. It mixes English prose, chat-like turns, digits and arithmetic, punctuation and code-ish lines, so that
common words become single tokens and every kind of text the tests send encodes compactly. The text is
generated from fixed word lists with a fixed seed: the same corpus, hence the same tokenizer, every time.
"""

from __future__ import annotations

import random

_NOUNS = (
    "time year people way day man woman child world life hand part place case week company system program "
    "question work government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father power hour "
    "game line end member law car city community name president team minute idea body information back "
    "parent face others level office door health person art war history party result change morning "
    "reason research girl guy moment air teacher force education model token server client request "
    "response error message batch weight gradient loss step sample prompt answer problem solution "
    "function value list table file folder network memory engine record garden river mountain forest "
    "ocean animal bird tree flower apple bread music color picture window kitchen street village market "
    "school student library letter paper question"
).split()
_VERBS = (
    "is was has had does did says said gets got makes made goes went knows knew takes took sees saw comes "
    "came thinks thought looks looked wants wanted gives gave uses used finds found tells told asks asked "
    "works worked seems seemed feels felt tries tried leaves left calls called trains trained samples "
    "returns returned computes computed writes wrote reads read builds built runs ran opens opened closes "
    "closed learns learned moves moved plays played starts started stops stopped helps helped shows "
    "showed"
).split()
_ADJECTIVES = (
    "good new first last long great little own other old right big high different small large next early "
    "young important few public bad same able simple quick slow bright dark happy careful quiet strong "
    "random tiny final local remote empty full clear correct wrong open closed warm cold green blue red"
).split()
_ADVERBS = "quickly slowly carefully often never always again soon today here there now then also".split()
_EXTRA_WORDS = (
    "about above across action activity actually add address admit adult affect after afternoon against "
    "age agency agent agree agreement ahead allow almost alone along already although amount analysis "
    "animal another answer anyone anything appear apply approach argue arm around arrive article artist "
    "assume attack attention attorney audience author authority available avoid away baby bag ball bank "
    "bar base beat beautiful because become bed before begin behavior behind believe benefit best better "
    "between beyond bill billion bit black blood board boy break bring brother budget building campaign "
    "cancer candidate capital card care career carry catch cause cell center central century certain "
    "chair challenge chance character charge check choice choose church citizen civil claim class clearly "
    "coach collection college commercial common compare computer concern condition conference consider "
    "consumer contain continue control cost could country couple course court cover create crime cultural "
    "culture cup current customer cut data daughter dead deal death debate decade decide decision deep "
    "defense degree democratic describe design despite detail determine develop development difference "
    "difficult dinner direction director discover discuss discussion disease doctor dog dream drive drop "
    "drug during each economic economy edge effect effort eight either election else employee energy "
    "enjoy enough enter entire environment environmental especially establish even evening event ever "
    "every everybody everyone everything evidence exactly example executive exist expect experience "
    "expert explain factor fail fall family far fast fear federal feeling field fight figure fill film "
    "finally financial fine finger finish fire firm fish five floor fly focus follow food foot foreign "
    "forget form former forward four free front fund future garden general generation glass goal ground "
    "group grow growth guess gun hair half hang happen hard hear heart heat heavy hold hospital hot hotel "
    "huge human hundred husband image imagine impact improve include including increase indeed indicate "
    "individual industry inside instead institution interest interesting international interview "
    "investment involve island item itself join just keep key kill knowledge land language late later "
    "laugh lawyer lay lead leader learn least leg legal less lesson light likely listen little live loss "
    "love machine magazine main maintain major majority manage management manager many material matter "
    "maybe mean measure media medical meeting mention method middle might military million mind miss "
    "mission modern mouth movement movie music myself national natural nature near nearly necessary need "
    "never news newspaper nice none north note nothing notice occur offer officer official often once "
    "operation opportunity option order organization original outside owner page pain painting particular "
    "partner pass past patient pattern pay peace perform performance perhaps period personal phone "
    "physical pick piece plan plant player police policy political politics poor popular population "
    "position positive possible practice prepare present pressure pretty prevent price private probably "
    "process produce product production professional professor property protect prove provide pull "
    "purpose push quality quite radio raise range rate rather reach ready real reality realize receive "
    "recent recently recognize record reduce reflect region relate relationship religious remain remember "
    "remove report represent republican require resource respond rest reveal rich rise risk road rock "
    "role rule safe scene science scientist score season seat second section security seek sell send "
    "senior sense series serious serve set seven several shake share shoot short shot should shoulder "
    "similar since single sister sit site situation size skill skin smile social society soldier somebody "
    "someone something sometimes son song sort sound source south southern space speak special specific "
    "speech spend sport spring staff stage stand standard star state statement station stay still stock "
    "store strategy structure stuff style subject success successful suddenly suffer suggest summer "
    "support sure surface table task tax teach technology television tend term test thank theory thing "
    "third those though thousand threat three through throughout throw thus together tonight total tough "
    "toward town trade traditional training travel treat treatment trial trip trouble true truth turn "
    "type under understand unit until upon usually various victim view violence visit voice vote wait "
    "walk wall watch weapon wear western whatever whether which while white whole whom whose wide wife "
    "will win wish within without wonder worker worry would yard yeah yes yet yourself zero one two six "
    "nine ten eleven twelve"
).split()

_NAMES = "Alice Bob Carol David Emma Frank Grace Henry Iris Jack Kate Leo Maria Noah Olivia Paul".split()
_CODE_LINES = (
    "def main(argv: list[str]) -> int:",
    "    return 0",
    "import os\nimport sys\nfrom pathlib import Path",
    "for i in range(10):\n    print(i * i)",
    "if x is None:\n    raise ValueError('x must be set')",
    "class Model(nn.Module):\n    def forward(self, ids):\n        return self.lm_head(self.embed(ids))",
    "result = {\"id\": 42, \"name\": \"tiny\", \"values\": [1, 2, 3]}",
    "while (n > 0) { n--; total += n; }",
    "const data = await fetch(url).then((r) => r.json());",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "x = np.zeros((4, 8), dtype=np.float32)",
    "loss = -logprobs[mask].sum() / mask.sum()",
    "with open(path, 'r', encoding='utf-8') as f:\n    text = f.read()",
    "async def sample(self, prompt, num_samples=1):\n    return await self.client.sample(prompt)",
    "assert len(tokens) == 33, f\"got {len(tokens)}\"",
    "# TODO: handle the empty case\n// comment\n/* block comment */",
)
_PUNCTUATION = "Hello, world! What? Yes... no; maybe: (a) [b] {c} <d> \"quoted\" 'single' - -- — @ # $ % ^ &"


def _sentence(rng: random.Random) -> str:
    """One random English-like sentence."""
    noun_phrase = f"the {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
    subject = rng.choice(_NAMES) if rng.random() < 0.3 else noun_phrase
    words = [subject, rng.choice(_VERBS)]
    if rng.random() < 0.5:
        words.append(rng.choice(_ADVERBS))
    words.append(f"a {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}")
    if rng.random() < 0.4:
        words.append(f"with the {rng.choice(_NOUNS)}")
    if rng.random() < 0.6:
        words.append(" ".join(rng.choice(_EXTRA_WORDS) for _ in range(rng.randint(2, 6))))
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice(".!?.")


def _arithmetic(rng: random.Random) -> str:
    """One arithmetic fact such as '12+7=19' or 'What is 6 * 7? 42'."""
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    op = rng.choice("+-*")
    value = a + b if op == "+" else a - b if op == "-" else a * b
    if rng.random() < 0.5:
        return f"{a}{op}{b}={value}"
    return f"What is {a} {op} {b}? The answer is {value}."


def _chat_turn(rng: random.Random) -> str:
    """A ChatML-looking exchange, without the special tokens themselves."""
    question = _sentence(rng).rstrip(".!?") + "?"
    return f"user\n{question}\nassistant\n{_sentence(rng)} {_sentence(rng)}\n"


def training_corpus(num_lines: int = 6000, seed: int = 0) -> list[str]:
    """The deterministic list of training lines (same arguments, same list)."""
    rng = random.Random(seed)
    lines: list[str] = [" ".join(words) for words in (_NOUNS, _VERBS, _ADJECTIVES, _EXTRA_WORDS)]
    lines.append(_PUNCTUATION)
    lines.extend(_CODE_LINES)
    makers = (_sentence, _sentence, _sentence, _arithmetic, _chat_turn)
    for index in range(num_lines):
        lines.append(makers[index % len(makers)](rng))
        if index % 50 == 0:
            lines.append(rng.choice(_CODE_LINES))
    return lines
