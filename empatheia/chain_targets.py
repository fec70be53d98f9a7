"""Rule-built Chain-of-Empathy targets for data that lacks steps of the chain.

The paper had GPT-4 write each ED utterance's event scenario, emotion cause and goal to
response (Appendix, "Augmenting the ED dataset"); the released AvaMERG training data
carries them as ``chain_of_empathy``. EmpatheticDialogues itself gives only a situation
prompt, the speaker's turns and an emotion label, so this module builds the missing steps
from those with a few deterministic rules (no model), in the paper's short style:

==============  =========================================  ===================================
step            built from                                 rule
==============  =========================================  ===================================
event scenario  the situation (else the speaker's first     its first sentence of three words
                turn)                                      or more, without fillers ("so,",
                                                           "well,") and a leading subordinate
                                                           clause, in the third person,
                                                           trimmed to :data:`EVENT_WORDS`
emotion         the emotion label                          as it is
emotion cause   the situation, then the speaker's turns    the first causal clause
                                                           ("because ...", "due to ...", an
                                                           emotion word then "that/about/of/
                                                           when/after ...", "..., so I"), in
                                                           the third person; else the event's
                                                           first clause, "..., which made
                                                           them feel <emotion>"
goal            the reply (when known), the emotion and    what the reply does (:func:`reply_acts`:
                the speaker's last turn                    "Expressing sympathy and asking what
                                                           happened"), else :data:`GOALS` of the
                                                           label (else of its class); a question
                                                           in the last turn asks for an answer, a
                                                           request for advice for advice, first
==============  =========================================  ===================================

Third person: the first reference to the speaker ("I", "me", "my") becomes "the speaker"
/ "the speaker's" (its verb agreeing: "I am" -> "the speaker is", "I feel" -> "the speaker
feels"), later ones "they" / "them" / "their"; "we", "us", "our" become "they", "them",
"their". An event with no first-person word at all is framed as "The speaker mentions
that ...", so that it reads as told about the speaker, not by them.

Steps a record already has are kept exactly as they are (:func:`complete_chain`).
``bench/chain_targets.py`` measures the targets on an ED file (docs/data.md).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from .labels import EMOTION_FOLD, normalize_label
from .prompts import ChainOfEmpathy, chain_is_complete

EVENT_WORDS = 18
"""An event scenario keeps at most this many words (cut at a clause boundary if one falls
in the second half, else after the limit)."""
CAUSE_WORDS = 12
"""An emotion cause keeps at most this many words (cut the same way)."""

# The goal of the response per emotion, in the paper's style ("Alleviating fear",
# "Validate the speaker's embarrassment, providing reassurance and comfort"): ED's 32
# labels, then the 7 classes of the emotion fold for any other label.
GOALS = {
    # loss and sadness ask for comfort
    "sad": "Comforting the speaker and showing understanding of their sadness",
    "devastated": "Offering comfort and sympathy for the speaker's pain",
    "lonely": "Offering the speaker company and comfort in their loneliness",
    "disappointed": "Acknowledging the speaker's disappointment and offering encouragement",
    "nostalgic": "Sharing the speaker's fond memories and showing interest in them",
    "sentimental": "Honouring the speaker's memories and showing understanding",
    # self-conscious feelings ask for reassurance without judgement
    "embarrassed": "Validating the speaker's embarrassment and providing reassurance",
    "ashamed": "Easing the speaker's shame and offering reassurance",
    "guilty": "Easing the speaker's guilt without judging them",
    # fear and worry ask for reassurance
    "afraid": "Alleviating the speaker's fear and offering reassurance",
    "terrified": "Alleviating the speaker's fear and offering reassurance",
    "anxious": "Easing the speaker's anxiety and offering reassurance",
    "apprehensive": "Easing the speaker's worry and offering encouragement",
    # anger and disgust ask to be heard
    "angry": "Acknowledging the speaker's anger and validating their feelings",
    "furious": "Acknowledging the speaker's anger and validating their feelings",
    "annoyed": "Acknowledging the speaker's frustration and showing understanding",
    "disgusted": "Validating the speaker's disgust and showing understanding",
    "jealous": "Acknowledging the speaker's jealousy and affirming their own worth",
    # success and joy ask to be shared
    "proud": "Sharing the speaker's pride and acknowledging their achievement",
    "joyful": "Sharing the speaker's joy",
    "excited": "Sharing the speaker's excitement",
    "content": "Sharing the speaker's contentment and affirming their good feelings",
    "grateful": "Acknowledging the speaker's gratitude and sharing their appreciation",
    "impressed": "Sharing the speaker's admiration",
    "surprised": "Sharing the speaker's surprise and showing interest in what happened",
    # confidence and hope ask for encouragement
    "confident": "Affirming the speaker's confidence and encouraging them",
    "hopeful": "Encouraging the speaker's hope",
    "anticipating": "Sharing the speaker's anticipation and encouraging them",
    "prepared": "Affirming the speaker's readiness and encouraging them",
    "trusting": "Affirming the speaker's trust and showing understanding",
    "faithful": "Affirming the speaker's loyalty and commitment",
    "caring": "Appreciating the speaker's care for others",
    # the classes of the fold, for AvaMERG's other free-text emotions
    "happy": "Sharing the speaker's happiness",
    "fear": "Alleviating the speaker's fear and offering reassurance",
    "contempt": "Acknowledging the speaker's feelings without judging them",
}
# Labels that do not read as a feeling after "made them feel".
_FEELING_WORD = {"anticipating": "eager", "caring": "protective", "trusting": "able to trust"}

DEFAULT_GOAL = "Showing understanding of how the speaker feels"
"""The goal for an emotion that neither :data:`GOALS` nor the fold knows (or none)."""
QUESTION_GOAL = "Answering the speaker's question"
ADVICE_GOAL = "Giving the speaker advice"

_ADVICE = re.compile(
    r"\b(should I|should we|any (advice|tips|ideas|suggestions)|what would you do|what do you (suggest|recommend)"
    r"|how (do|can|should) I)\b", re.IGNORECASE)

# Words that carry a feeling: a clause after one of them names what caused it.
_FEELING_WORDS = sorted({word for word in EMOTION_FOLD if " " not in word}, key=len, reverse=True)
_CAUSE_AFTER_FEELING = re.compile(
    r"\b(?:" + "|".join(_FEELING_WORDS) + r")\s+"
    r"(?:that|about|of|for|by|at|with|when|after|since|to see|to hear|to find out|to find|to learn|to know)\s+(.+)",
    re.IGNORECASE)
_CAUSE_CONNECTIVE = re.compile(r"\b(?:because of|because|due to|thanks to|cause)\s+(.+)", re.IGNORECASE)
_CAUSE_BEFORE_SO = re.compile(r"^(.{12,}?),?\s+so\s+(?:I|we)\b.*\b(?:" + "|".join(_FEELING_WORDS) + r"|feel|felt)\b",
                              re.IGNORECASE)

_REFLEXIVE = re.compile(r"^(?:myself|ourselves)\s+(?:(?:for|when|after|because|that)\s+)?", re.IGNORECASE)
_FILLER = re.compile(r"^(?:so|well|ok|okay|oh|um|uh|yeah|yes|lol|honestly|basically|wow|ugh|hey|hi)\b[,.!]*\s+",
                     re.IGNORECASE)
_LEADING_CLAUSE = re.compile(
    r"^(?:[A-Za-z]+,\s*)?(?:when|as|while|after|before|since|because|although|though|if|once)\b[^,]{3,}?,\s+(.+)$",
    re.IGNORECASE)
_DANGLING = {"a", "an", "the", "of", "to", "in", "on", "at", "for", "with", "from", "by", "and", "or", "but", "my",
             "your", "his", "her", "our", "their", "that", "so", "very", "really", "is", "was", "i", "we", "i'm",
             "im", "we're", "he", "she", "it", "they", "who", "am", "are", "were", "under", "into", "about", "over",
             "through", "after", "before", "as", "if", "than"}
_BOUNDARY_WORDS = {"and", "but", "so", "because", "which", "while", "though", "although", "since", "until", "when",
                   "where"}
_OPENERS = {"the", "a", "an", "this", "that", "these", "those", "it", "its", "there", "they", "their", "them", "one",
            "some", "someone", "somebody", "everyone", "everybody", "nobody", "all", "today", "yesterday", "last",
            "when", "after", "while", "before", "during", "finally", "recently", "every", "most", "many", "no"}

# Verb agreement after "the speaker": these become their third-person singular form; past
# forms and modals need nothing, and any other word is left as written.
_PRESENT_VERBS = {
    "feel", "think", "love", "hate", "know", "miss", "hope", "wish", "need", "want", "like", "get", "see", "go",
    "work", "live", "keep", "look", "remember", "start", "try", "believe", "enjoy", "worry", "care", "appreciate",
    "trust", "take", "make", "say", "play", "find", "mean", "guess", "wonder", "agree", "forget", "plan", "expect",
    "wait", "spend", "own", "prefer", "seem", "understand", "fear", "dread", "regret", "admire", "cherish", "lack",
    "tend", "struggle", "run", "use", "study", "owe", "deserve", "realize", "realise", "watch", "cry", "scrapbook",
    "buy", "eat", "drive", "read", "write", "sleep", "walk", "talk", "call", "visit", "help", "teach", "learn",
}
_SINGULAR = {"am": "is", "are": "is", "have": "has", "haven't": "hasn't", "havent": "hasn't", "do": "does",
             "don't": "doesn't", "dont": "doesn't", "were": "was", "weren't": "wasn't"}
# "I'm" -> "the speaker is" or "they are" ("I'd" is read as "I would").
_CONTRACTED = {"i'm": ("is", "are"), "i've": ("has", "have"), "i'll": ("will", "will"), "i'd": ("would", "would")}
_PLURAL = {"am": "are", "was": "were", "wasn't": "weren't", "wasnt": "weren't"}
_ADVERBS = {"just", "really", "finally", "recently", "always", "never", "still", "also", "usually", "accidentally",
            "almost", "once", "actually", "truly", "totally", "completely", "definitely", "sometimes", "often",
            "absolutely", "kinda", "kind", "sort", "of", "even", "only", "already", "ever", "literally", "so"}
_FIRST_PERSON = re.compile(r"\b(?:I|I'm|I've|I'll|I'd|me|my|mine|myself|we|us|our)\b", re.IGNORECASE)
_TOKEN = re.compile(r"\s+|[A-Za-z]+(?:'[A-Za-z]+)?|[^\sA-Za-z]")


def _tidy(text: str) -> str:
    """One line with ED's typing slips mended: a space after a comma between words,
    lone "i" and "im"/"ive" capitalised, straight apostrophes."""
    text = re.sub(r"\s+", " ", text.replace("\u2019", "'")).strip()
    text = re.sub(r"(?<=[A-Za-z])([,;])(?=[A-Za-z])", r"\1 ", text)
    text = re.sub(r"\bim\b", "I'm", text, flags=re.IGNORECASE)
    text = re.sub(r"\bive\b", "I've", text, flags=re.IGNORECASE)
    return re.sub(r"\bi\b", "I", text)


def _third_singular(verb: str) -> str:
    if verb in _SINGULAR:
        return _SINGULAR[verb]
    if verb not in _PRESENT_VERBS:
        return verb
    if re.search(r"(s|sh|ch|x|z|o)$", verb):
        return verb + "es"
    if re.search(r"[^aeiou]y$", verb):
        return verb[:-1] + "ies"
    return verb + "s"


def third_person(text: str) -> str:
    """``text`` told about the speaker rather than by them (the module docstring's rule);
    sentence starts capitalised."""
    tokens = _TOKEN.findall(_tidy(text))
    named = False  # "the speaker" has been written: later references are "they"
    out: List[str] = []
    i = 0
    while i < len(tokens):
        token, low = tokens[i], tokens[i].lower()
        if low == "i":
            out.append("they" if named else "the speaker")
            out.extend(_agree(tokens, i + 1, singular=not named))
            i = _skip_agreed(tokens, i + 1)
            named = True
            continue
        if low in _CONTRACTED:
            singular, plural = _CONTRACTED[low]
            out.append(f"they {plural}" if named else f"the speaker {singular}")
            named = True
        elif low in ("me", "myself"):
            out.append("themselves" if low == "myself" else ("them" if named else "the speaker"))
            named = named or low == "me"
        elif low in ("my", "mine"):
            out.append(("their" if low == "my" else "theirs") if named else "the speaker's")
            named = True
        elif low in ("we", "we're", "we've", "we'll", "we'd"):
            out.append("they" + low[2:])
            out.extend(_agree(tokens, i + 1, singular=False))
            i = _skip_agreed(tokens, i + 1)
            continue
        elif low == "am":  # its subject "I" was left out ("I scrapbook and am behind")
            out.append("is")
        elif token in ("us", "Us"):  # not "US", the country
            out.append("them")
        elif low in ("our", "ours", "ourselves"):
            out.append({"our": "their", "ours": "theirs", "ourselves": "themselves"}[low])
        else:
            out.append(token)
        i += 1
    return _capitalise("".join(out))


def _agree(tokens: Sequence[str], start: int, singular: bool) -> List[str]:
    """The tokens after a subject up to and including its verb (adverbs in between), the
    verb agreeing with "the speaker" (``singular``) or "they"."""
    out = []
    for j in range(start, len(tokens)):
        token, low = tokens[j], tokens[j].lower()
        if token.isspace() or low in _ADVERBS:
            out.append(token)
            continue
        agreed = _third_singular(low) if singular else _PLURAL.get(low, low)
        out.append(token if agreed == low else agreed)
        break
    return out


def _skip_agreed(tokens: Sequence[str], start: int) -> int:
    """The index after the tokens :func:`_agree` consumed from ``start``."""
    for j in range(start, len(tokens)):
        if not (tokens[j].isspace() or tokens[j].lower() in _ADVERBS):
            return j + 1
    return len(tokens)


def _capitalise(text: str) -> str:
    return re.sub(r"(^|[.!?]\s+)([a-z])", lambda m: m.group(1) + m.group(2).upper(), text)


def _sentences(text: str) -> List[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", _tidy(text)) if s.strip(" .!?")]


def _trim(text: str, limit: int) -> str:
    """At most ``limit`` words: cut at the last clause boundary (a comma, or a word such as
    "and", "but", "which") in the second half of the limit, else after ``limit`` words;
    no closing punctuation."""
    words = text.split()
    if len(words) > limit:
        cuts = [i for i in range(limit // 2, limit + 1) if _boundary(words, i, ("that", "who"))]
        words = words[: cuts[-1] if cuts else limit]
        # A cut must not leave "... a good friend of": dangling small words go too.
        while len(words) > 1 and words[-1].lower().strip(",;:") in _DANGLING:
            words.pop()
    return " ".join(words).rstrip(" ,;:.!?-")


def _has_feeling(text: str) -> bool:
    return any(normalize_label(w) in EMOTION_FOLD for w in re.findall(r"[A-Za-z]+", text))


def _first_sentence(*texts: Optional[str]) -> Optional[str]:
    """The first telling sentence of ``texts`` taken in order, fillers off: one of three
    words or more that is not a question and speaks of the speaker ("I", "my", ...), else
    the first such sentence without the speaker, else the first sentence."""
    sentences = [s for text in texts if text for s in _sentences(text)]
    if not sentences:
        return None
    told = [s for s in sentences if len(s.split()) >= 3 and not s.rstrip().endswith("?")]
    sentence = next((s for s in told if _FIRST_PERSON.search(s)), told[0] if told else sentences[0])
    while _FILLER.match(sentence):
        sentence = _FILLER.sub("", sentence, count=1)
    return sentence


def _event_sentence(*texts: Optional[str]) -> Optional[str]:
    """The sentence the event is told from (:func:`_first_sentence`), without a leading
    subordinate clause: "When I got home, I found the door open" -> "I found the door
    open", unless the main clause is only the feeling ("..., I was so happy"), which the
    emotion step already names."""
    sentence = _first_sentence(*texts)
    leading = _LEADING_CLAUSE.match(sentence or "")
    if leading and len(leading.group(1).split()) >= 4 and not _has_feeling(leading.group(1)):
        return leading.group(1)
    return sentence


def event_scenario(situation: Optional[str], first_turn: Optional[str] = None) -> Optional[str]:
    """The event step from the situation, else the speaker's first turn: module docstring."""
    sentence = _event_sentence(situation, first_turn)
    if not sentence:
        return None
    told = third_person(_trim(sentence, EVENT_WORDS))
    if "speaker" not in told.lower():
        told = "The speaker mentions that " + _lower_first(told)
    return told + "."


def _lower_first(text: str) -> str:
    # Openers such as "The", "They", "Today" lose their capital; a name ("John") keeps it.
    first = text.split(" ", 1)[0]
    return text[0].lower() + text[1:] if first.lower() in _OPENERS else text


def _cause_clause(text: str) -> Optional[str]:
    for sentence in _sentences(text):
        for pattern in (_CAUSE_CONNECTIVE, _CAUSE_AFTER_FEELING, _CAUSE_BEFORE_SO):
            match = pattern.search(sentence)
            # "proud of myself for finishing", "happy about myself when I graduated": the
            # cause is what follows the reflexive.
            clause = _REFLEXIVE.sub("", match.group(1)) if match else ""
            if len(clause.split()) >= 2:
                return clause
    return None


def emotion_cause(situation: Optional[str], speaker_turns: Sequence[str] = (), emotion: Optional[str] = None
                  ) -> Optional[str]:
    """The cause step: the first causal clause of the situation or, failing that, of the
    speaker's turns in order; else the event's first clause, tied to the emotion ("...,
    which made them feel terrified") so that the step says more than the event's."""
    for text in [situation or "", *speaker_turns]:
        clause = _cause_clause(text)
        if clause:
            return third_person(_trim(clause, CAUSE_WORDS)) + "."
    sentence = _event_sentence(situation, *speaker_turns[:1])
    if not sentence:
        return None
    core = third_person(_trim(_first_clause(sentence), CAUSE_WORDS))
    feeling = normalize_label(emotion) if emotion else ""
    return f"{core}, which made them feel {_FEELING_WORD.get(feeling, feeling)}." if feeling else core + "."


def _first_clause(sentence: str) -> str:
    """Up to the first clause boundary after five words or more ("I sat in something wet
    and didn't know it" -> "I sat in something wet"): the event's core, shorter than the
    event step."""
    words = sentence.split()
    for i in range(5, len(words)):
        if _boundary(words, i):
            return " ".join(words[:i])
    return sentence


def _boundary(words: Sequence[str], i: int, more: Sequence[str] = ()) -> bool:
    """Whether a clause may end before ``words[i]``: after a comma, or before a word such
    as "and" or "because" (and ``more``), but not inside "my boyfriend and I"."""
    if words[i - 1].endswith((",", ";", ":")):
        return True
    word, after = words[i].lower(), words[i + 1].lower() if i + 1 < len(words) else ""
    if word == "and" and after.strip(",.") in ("i", "me", "my", "we", "us", "our"):
        return False
    return word in _BOUNDARY_WORDS or word in more


# What a listener's reply does, in the order the acts are tried on each sentence. The goal
# step of a dialogue whose reply is known says which of these the reply does, so that the
# goal plans this reply rather than restating the label's one goal, the same for every
# dialogue of that label.
REPLY_ACTS = (
    ("Congratulating the speaker", re.compile(
        r"\b(congrat\w*|accomplishment|achievement|good job|great job|nice job|well done|good for you|proud of you"
        r"|way to go|kudos|keep (it )?up)\b")),
    ("Expressing sympathy", re.compile(
        r"\b(sorry|oh no|sucks|so sad|too bad|no good|not (good|fun|nice)|doesn'?t sound (too |very |so )?(good|fun|nice)"
        r"|what a shame|poor (thing|guy|girl|dog|cat|baby)"
        r"|(that'?s|that is|how|so|sounds) (so |really |very |just )?(terrible|awful|horrible|sad|rough|tough|unfortunate"
        r"|heartbreaking|painful|scary|frightening|frustrating|annoying|upsetting|hard|bad|a shame))\b")),
    ("Reassuring the speaker", re.compile(
        r"\b(don'?t worry|do not worry|i'?m sure|i am sure|i bet (you|it|they|she|he)|you'?ll (be|do|get|make|have|find)"
        r"|you will (be|do|get|make|have|find)|it'?ll (be|work|all)|it will (be|work)|everything will|things will"
        r"|you can do it|you('?ve)? got this|no shame|not your fault|happens to (everyone|everybody|the best))\b")),
    ("Pointing out the bright side", re.compile(r"\b(at least|look on the bright side|silver lining|on the bright side"
                                                 r"|blessing in disguise|could have been worse)\b")),
    ("Sharing the speaker's happiness", re.compile(r"\b(i'?m (so |really |very )?(glad|happy for you)|i am (so |really "
                                                    r"|very )?(glad|happy for you)|glad to hear|happy to hear)\b")),
    ("Suggesting what the speaker could do", re.compile(
        r"\b(you should|you could|maybe you|perhaps you|why don'?t you|why not|try to|you might want|you need to"
        r"|have you (tried|thought|considered)|make sure|just try"
        r"|i would (just )?(tell|talk|ask|call|go|get|try|see|look))\b")),
    ("Wishing the speaker well", re.compile(r"\b(i hope|hope (you|it|they|she|he|things|everything)|hopefully"
                                             r"|good luck|best of luck|fingers crossed)\b")),
    ("Showing understanding of how the speaker feels", re.compile(
        r"\b(i understand|i can (imagine|understand|see why|relate)|i know (how|what|the feeling)|i get (it|that)"
        r"|must (have been|be|feel)|that makes sense|understandable|no wonder|i would (be|feel|have been|have felt))\b")),
    ("Agreeing with the speaker", re.compile(
        r"^(yes|yeah|yep|exactly|definitely|absolutely|agreed|i agree|you'?re right|so true|true|same)\b")),
    # A sentence that is only "Wow." reacts; "Wow, that's great." shares the enthusiasm.
    ("Reacting with surprise", re.compile(
        r"\b(unbelievable|incredible|crazy|no way|can'?t believe|omg|oh my|holy|whoa|insane)\b|^(oh )?wow\W*$")),
    ("Sharing the speaker's enthusiasm", re.compile(
        r"\b(wow|yay|awesome|amazing|wonderful|fantastic|exciting|(that'?s|that is|sounds|how|so) (so |really |very "
        r"|pretty |super |such a |a )?(great|cool|nice|fun|good|lovely|neat|sweet|impressive|exciting|interesting))\b")),
    ("Sharing a similar experience", re.compile(
        r"\b(me too|same here|i (have|had|used to|remember|once|also|love|loved|did|went|feel the same|felt the same)"
        r"|my (\w+))\b")),
)
# The question a reply asks, by its first matching kind.
QUESTION_ACTS = (
    ("Asking what happened", re.compile(r"\bwhat (happened|went wrong|did (he|she|they|it) do)\b")),
    ("Asking how the speaker is feeling", re.compile(
        r"\b(how (are|do|did|were) you (feel|feeling|doing|holding|handling|coping)|are you (ok|okay|alright|all right|fine"
        r"|feeling|doing|still|hurt)|how do you feel)\b")),
    ("Asking what the speaker will do", re.compile(
        r"\b(what (are|will|do|did) you (going to |gonna |plan to |end up )?(do|plan)|are you going to|will you|do you plan"
        r"|what'?s next|did you (end up|decide))\b")),
    ("Asking why", re.compile(r"\b(why|how come)\b")),
)
OTHER_QUESTION = "Asking the speaker for details"
ACT_NAMES = (*(name for name, _ in REPLY_ACTS), *(name for name, _ in QUESTION_ACTS), OTHER_QUESTION)
"""Every act :func:`reply_acts` reads, in the order its rules try them."""
# ED's typists often drop the question mark: "What kind of con was it".
_QUESTION_START = re.compile(r"^(what|how|why|where|when|who|which|did|do|does|are|is|was|were|have|has|will|can|could"
                             r"|would)\b")
# Acts a question's own sentence may also do ("Congratulations, did you celebrate?").
_ACTS_BESIDE_A_QUESTION = ("Congratulating the speaker", "Expressing sympathy")
REPLY_ACT_LIMIT = 2
"""A goal built from the reply names at most this many of its acts (the first ones)."""


def reply_acts(reply: str) -> List[str]:
    """What ``reply`` does, as goal phrases in the order its sentences do them: each
    sentence adds its first act of :data:`REPLY_ACTS` not yet named, a question its kind of
    :data:`QUESTION_ACTS` (else "Asking the speaker for details"). At most
    :data:`REPLY_ACT_LIMIT`; none for a reply these rules do not read."""
    acts: List[str] = []
    for sentence in re.split(r"(?<=[.!?])\s+", _tidy(reply).lower()):
        if re.search(r"\?[?!.>\s]*$", sentence) or _QUESTION_START.match(sentence) and not sentence.endswith((".", "!")):
            # "Oh no, what happened?" sympathises and asks; "Did you win?" only asks.
            found = [name for name, rule in REPLY_ACTS if name in _ACTS_BESIDE_A_QUESTION and rule.search(sentence)][:1]
            found.append(next((name for name, rule in QUESTION_ACTS if rule.search(sentence)), OTHER_QUESTION))
        else:
            found = [next((name for name, rule in REPLY_ACTS if name not in acts and rule.search(sentence)), "")]
        acts.extend(name for name in found if name and name not in acts)
    return acts[:REPLY_ACT_LIMIT]


def response_goal(emotion: Optional[str], last_speaker_turn: str = "", reply: Optional[str] = None) -> str:
    """The goal step. With the ``reply`` known (training data), what it does
    (:func:`reply_acts`: "Expressing sympathy and asking what happened."); otherwise, or
    when the rules read no act in it, the emotion's goal (:data:`GOALS`, by label, else by
    its class of the fold). Either is led by answering a question or giving advice when the
    speaker's last turn asks."""
    acts = reply_acts(reply) if reply else []
    goal = goal_from_acts(acts) if acts else label_goal(emotion)
    return _led(goal, goal_lead(last_speaker_turn))


GOAL_LEADS = (None, QUESTION_GOAL, ADVICE_GOAL)
"""What a goal may open with: nothing, answering a question, giving advice."""


def goal_lead(last_speaker_turn: str) -> Optional[str]:
    """What the goal opens with after the speaker's last turn (one of :data:`GOAL_LEADS`):
    advice where the turn asks for it, an answer where it asks a question, else nothing."""
    return ADVICE_GOAL if _ADVICE.search(last_speaker_turn) else QUESTION_GOAL if "?" in last_speaker_turn else None


def label_goal(emotion: Optional[str]) -> str:
    """The emotion's goal (:data:`GOALS` by label, else by its class of the fold, else
    :data:`DEFAULT_GOAL`), without a full stop."""
    key = normalize_label(emotion) if emotion else ""
    return GOALS.get(key) or GOALS.get(EMOTION_FOLD.get(key, ""), DEFAULT_GOAL)


def goal_from_acts(acts: Sequence[str]) -> str:
    """The goal that names ``acts`` (:func:`reply_acts`' phrases) in order, without a full
    stop: "Congratulating the speaker and asking them for details"."""
    # One name for the speaker: later acts refer to them by pronoun.
    later = [_pronoun(act) for act in acts[1:]]
    return " and ".join([acts[0]] + [act[0].lower() + act[1:] for act in later])


def _led(goal: str, lead: Optional[str]) -> str:
    """``goal`` as the step writes it, after ``lead`` when there is one ("Answering the
    speaker's question while easing their worry."), with its full stop."""
    if lead is None:
        return goal + "."
    goal = _pronoun(goal)
    return f"{lead} while {goal[0].lower()}{goal[1:]}."


GOAL_ACT_SHARE = 0.04
"""An act fits an emotion (:func:`fit_goal_acts`) when at least this share of the
listeners' replies to speakers with that emotion do it."""


def fit_goal_acts(examples: Iterable[Tuple[Optional[str], Optional[str]]], min_share: float = GOAL_ACT_SHARE,
                  min_count: int = 3) -> Dict[str, List[str]]:
    """Which acts of :func:`reply_acts` fit each emotion, read from what listeners did:
    ``examples`` are ``(emotion, reply)`` pairs (a training split), and an act fits an
    emotion when at least ``min_share`` of that emotion's replies, and ``min_count`` of
    them, do it. Keys are the labels (normalised) and the classes of the fold that are not
    labels themselves (fitted over the class's replies), so that a label the data lacks
    still finds its class (:func:`fitting_acts`); acts in :func:`reply_acts`' order.
    Emotions without a reply are skipped; an emotion none of whose acts reaches the share
    gets an empty list (its label's goal alone fits it, :func:`goal_repertoire`).

    Why: a small core that chooses its goal freely picks the commonest act of its data
    wherever the dialogue does not point elsewhere, and congratulates grief; limited to
    what listeners do for the chosen emotion, its own scores choose among acts that fit."""
    if not 0 < min_share <= 1:
        raise ValueError(f"min_share must be in (0, 1], got {min_share}")
    table = {}
    for group, sequences in fit_goal_counts(examples).items():
        # A reply names an act at most once, so an act's replies are the counts of the
        # sequences that hold it.
        doing = Counter()
        for key, count in sequences.items():
            doing.update({act: count for act in key.split(ACT_SEPARATOR) if key})
        needed = max(min_count, min_share * sum(sequences.values()))
        table[group] = [act for act in ACT_NAMES if doing[act] >= needed]
    return table


def fit_goal_counts(examples: Iterable[Tuple[Optional[str], Optional[str]]]) -> Dict[str, Dict[str, int]]:
    """How many of the listeners' replies to each emotion do each sequence of acts
    (:func:`reply_acts`, keyed by :func:`act_key`; ``""`` for a reply the rules read no act
    in), from ``(emotion, reply)`` pairs (a training split). Keyed like
    :func:`fit_goal_acts`: the labels, and the classes of the fold that are not labels.

    Why: the goal a small core scores highest is the one its own data repeated most; these
    counts are what listeners chose for the emotion, a prior the goal choice can weigh the
    core's scores with (``language_model.chain_goal_prior_weight``)."""
    # Labels and classes counted apart: "sad" is both an ED label and the class that pools
    # "devastated", "nostalgic", ..., and the label keeps its own listeners' replies.
    counts: Dict[str, Dict[str, Counter]] = {"label": {}, "class": {}}
    for emotion, reply in examples:
        if not emotion or reply is None:
            continue
        key = normalize_label(emotion)
        acts = act_key(reply_acts(reply))
        for kind, group in (("label", key), ("class", EMOTION_FOLD.get(key, key))):
            counts[kind].setdefault(group, Counter())[acts] += 1
    table = {group: c for group, c in counts["class"].items() if group not in counts["label"]}
    table.update(counts["label"])
    return {group: dict(sorted(c.items())) for group, c in sorted(table.items())}


ACT_SEPARATOR = " + "


def act_key(acts: Sequence[str]) -> str:
    """The key of a sequence of acts in :func:`fit_goal_counts`' table: the acts joined by
    " + ", ``""`` for none."""
    return ACT_SEPARATOR.join(acts)


def goal_repertoire(acts: Sequence[str], emotion: Optional[str] = None,
                    leads: Sequence[Optional[str]] = GOAL_LEADS) -> List[str]:
    """Every goal the rules write (:func:`response_goal`) from ``acts`` for an ``emotion``:
    each act alone and each ordered pair of two (:data:`REPLY_ACT_LIMIT`), and the
    emotion's own goal (:func:`label_goal`), after each of ``leads`` (:func:`goal_lead`);
    with their full stops, lead by lead, no duplicates."""
    unknown = [act for act in acts if act not in ACT_NAMES]
    if unknown:
        raise ValueError(f"not acts of reply_acts: {', '.join(map(repr, unknown))}")
    plain = [goal_from_acts([act]) for act in acts]
    if REPLY_ACT_LIMIT >= 2:
        plain += [goal_from_acts([a, b]) for a in acts for b in acts if a != b]
    plain.append(label_goal(emotion))
    return list(dict.fromkeys(_led(goal, lead) for lead in leads for goal in plain))


def goal_acts(goal: str) -> List[str]:
    """The acts of :func:`reply_acts` that ``goal`` names (as the first act, or a later one
    with "the speaker" as a pronoun), in the order it names them; none for a label's goal.
    What a reply written after that goal should do."""
    goal = goal.lower()
    found = sorted((goal.find(form), name) for name, form in _ACT_FORMS if form in goal)
    return list(dict.fromkeys(name for _, name in found))


ACT_OPENING_WORDS = 5
"""An opening (:func:`fit_act_openings`) is at most this many words: the words before the
act's cue and the cue itself ("Oh no, what happened")."""

# Contractions typed without their apostrophe: an opening spelled so is not one to copy.
_UNMENDED = re.compile(r"\b(thats|dont|cant|wont|didnt|doesnt|isnt|wasnt|youre|youve|theyre|whats|hows)\b")


def sentence_opening(sentence: str) -> Optional[Tuple[str, str]]:
    """``(act, opening)``: the first act :func:`reply_acts` reads in one ``sentence`` of a
    reply and the words that open it up to and including that act's cue ("I'm so sorry",
    "Oh no, what happened"), lower case; for a question with no cue of its own, its first
    two words ("did you"). ``None`` where the rules read no act, the cue comes after the
    sentence's fourth word, or the opening is longer than :data:`ACT_OPENING_WORDS`."""
    sentence = _tidy(sentence).lower()
    if re.search(r"\?[?!.>\s]*$", sentence) or _QUESTION_START.match(sentence) and not sentence.endswith((".", "!")):
        rules = QUESTION_ACTS
    else:
        rules = REPLY_ACTS
    for name, rule in rules:
        match = rule.search(sentence)
        if match:
            before, opening = sentence[:match.start()], sentence[:match.end()].rstrip(" ,")
            if len(before.split()) > 3 or len(opening.split()) > ACT_OPENING_WORDS:
                return None
            return name, opening
    words = sentence.split()
    if rules is QUESTION_ACTS and _QUESTION_START.match(sentence) and len(words) >= 2:
        return OTHER_QUESTION, " ".join(words[:2]).rstrip(",?")
    return None


def fit_act_openings(replies: Iterable[Optional[str]], min_count: int = 3, limit: int = 12) -> Dict[str, List[str]]:
    """How listeners open each act of :func:`reply_acts`: the openings
    (:func:`sentence_opening`) that at least ``min_count`` sentences of ``replies`` (a
    training split's) begin with, at most ``limit`` per act, commonest first, spelled as a
    reply writes them ("I'm so sorry", "Oh no, what happened"). Openings typed without a
    contraction's apostrophe are left out.

    Why: a reply told to do its goal's acts (:class:`~empatheia.logits_processors.ReplyGoalOpenings`)
    opens each with words listeners use for it, the model's own scores choosing which."""
    if min_count < 1 or limit < 1:
        raise ValueError(f"min_count and limit must be at least 1, got {min_count} and {limit}")
    counts: Dict[str, Counter] = {}
    for reply in replies:
        for sentence in re.split(r"(?<=[.!?])\s+", _tidy(reply or "")):
            found = sentence_opening(sentence) if sentence else None
            if found and not _UNMENDED.search(found[1]):
                counts.setdefault(found[0], Counter())[found[1]] += 1
    openings = {}
    for act in ACT_NAMES:
        kept = [text for text, n in sorted(counts.get(act, Counter()).items(), key=lambda item: (-item[1], item[0]))
                if n >= min_count][:limit]
        if kept:
            openings[act] = [_as_written(text) for text in kept]
    return openings


def _as_written(opening: str) -> str:
    """A lower-case opening as a sentence starts it: capitalised, "I" as a word upper case."""
    opening = re.sub(r"\bi\b", "I", opening)
    return opening[0].upper() + opening[1:]


def _pronoun(phrase: str) -> str:
    """``phrase`` with "the speaker" as a pronoun, for a goal that has named them already."""
    phrase = re.sub(r"\bthe speaker (could|will|is|feels)\b",
                    lambda m: "they " + {"is": "are", "feels": "feel"}.get(m.group(1), m.group(1)), phrase)
    return phrase.replace("the speaker's", "their").replace("the speaker", "them")


# Each act with the forms a goal writes it in, first or later (lower case, then "the
# speaker" as a pronoun): (act, form) pairs.
_ACT_FORMS = tuple(dict.fromkeys((name, form.lower()) for name in ACT_NAMES for form in (name, _pronoun(name))))


def complete_chain(chain: Optional[ChainOfEmpathy], situation: Optional[str], speaker_turns: Sequence[str],
                   emotion: Optional[str] = None, reply: Optional[str] = None) -> ChainOfEmpathy:
    """``chain`` with each missing step built by the rules (a new object; the given steps
    are kept exactly as they are, and a chain with all four is returned unchanged).
    ``situation`` is the dialogue's situation or context, ``speaker_turns`` the speaker's
    utterances in order, ``emotion`` the emotion step when the chain has none (an emotion
    is never made up: without either, the step stays empty), ``reply`` the listener's
    reply when it is known (the goal then says what it does, :func:`response_goal`)."""
    chain = chain if chain is not None else ChainOfEmpathy()
    if chain_is_complete(chain):
        return chain
    turns = [t for t in speaker_turns if t and t.strip()]
    emotion = chain.speaker_emotion or emotion
    return replace(
        chain,
        event_scenario=_given(chain.event_scenario) or event_scenario(situation, *turns[:1]),
        speaker_emotion=emotion,
        emotion_cause=_given(chain.emotion_cause) or emotion_cause(situation, turns, emotion),
        goal_to_response=_given(chain.goal_to_response) or response_goal(emotion, turns[-1] if turns else "", reply),
    )


def _given(step: Optional[str]) -> Optional[str]:
    return step if step is not None and step.strip() else None


GOAL_ACTS_FORMAT = "empatheia-goal-acts"


def save_goal_acts(table: Dict[str, List[str]], path, openings: Optional[Dict[str, List[str]]] = None,
                   goal_counts: Optional[Dict[str, Dict[str, int]]] = None, **about) -> None:
    """Write :func:`fit_goal_acts`' ``table`` as JSON, with :func:`fit_act_openings`'
    ``openings`` and :func:`fit_goal_counts`' ``goal_counts`` where given (``about``: how
    they were fitted, kept beside them for whoever reads the file)."""
    data = {"format": GOAL_ACTS_FORMAT, **about, "acts": table}
    if openings is not None:
        data["openings"] = openings
    if goal_counts is not None:
        data["goal_counts"] = goal_counts
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


def _read_goal_acts_file(path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: not a goal-acts file ({error})") from None
    if not isinstance(data, dict) or data.get("format") != GOAL_ACTS_FORMAT:
        raise ValueError(f"{path}: field 'format' must be {GOAL_ACTS_FORMAT!r} (written by `empatheia data goal-acts`)")
    return data


def load_act_openings(path) -> Dict[str, List[str]]:
    """The openings :func:`save_goal_acts` wrote beside the acts; a ``ValueError`` naming
    the file and the field where there are none or they are malformed."""
    openings = _read_goal_acts_file(path).get("openings")
    if not isinstance(openings, dict) or not openings:
        raise ValueError(f"{path}: field 'openings' must map acts to their openings (`empatheia data goal-acts` "
                         f"writes them; an older file lacks them: fit it again)")
    for act, texts in openings.items():
        if act not in ACT_NAMES:
            raise ValueError(f"{path}: field 'openings' names {act!r}, not an act of reply_acts")
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t.strip() for t in texts):
            raise ValueError(f"{path}: field 'openings.{act}' must be a list of non-empty strings, got {texts!r}")
    return {act: list(texts) for act, texts in openings.items()}


def load_goal_counts(path) -> Dict[str, Dict[str, int]]:
    """The counts :func:`save_goal_acts` wrote beside the acts; a ``ValueError`` naming the
    file and the field where there are none or they are malformed."""
    counts = _read_goal_acts_file(path).get("goal_counts")
    if not isinstance(counts, dict) or not counts:
        raise ValueError(f"{path}: field 'goal_counts' must map emotions to the counts of their replies' acts "
                         f"(`empatheia data goal-acts` writes them; an older file lacks them: fit it again)")
    for emotion, row in counts.items():
        if not isinstance(row, dict) or not all(isinstance(n, int) and n >= 0 for n in row.values()):
            raise ValueError(f"{path}: field 'goal_counts.{emotion}' must map act sequences to counts, got {row!r}")
        unknown = [act for key in row for act in key.split(ACT_SEPARATOR) if key and act not in ACT_NAMES]
        if unknown:
            raise ValueError(f"{path}: field 'goal_counts.{emotion}' names {unknown[0]!r}, not an act of reply_acts")
    return {normalize_label(emotion): dict(row) for emotion, row in counts.items()}


def load_goal_acts(path) -> Dict[str, List[str]]:
    """The table :func:`save_goal_acts` wrote; a ``ValueError`` naming the file and the
    field for anything else."""
    data = _read_goal_acts_file(path)
    table = data.get("acts")
    if not isinstance(table, dict):
        raise ValueError(f"{path}: field 'acts' must map each emotion to its list of acts")
    for emotion, acts in table.items():
        if not isinstance(acts, list) or any(act not in ACT_NAMES for act in acts):
            raise ValueError(f"{path}: field 'acts.{emotion}' must list acts of reply_acts, got {acts!r}")
    return {normalize_label(emotion): list(acts) for emotion, acts in table.items()}


def fitting_acts(table: Dict[str, List[str]], emotion: Optional[str]) -> List[str]:
    """The acts ``table`` (:func:`fit_goal_acts`) lists for ``emotion``, else for its class
    of the fold; none for an emotion it knows neither way."""
    return emotion_row(table, emotion, [])


def emotion_row(table: Dict[str, Any], emotion: Optional[str], default: Any = None) -> Any:
    """``table``'s row for ``emotion`` (keyed by normalised label), else for its class of
    the fold (how :func:`fit_goal_acts` and :func:`fit_goal_counts` key their tables), else
    ``default``."""
    key = normalize_label(emotion) if emotion else ""
    if key in table:
        return table[key]
    return table.get(EMOTION_FOLD.get(key, ""), default)
