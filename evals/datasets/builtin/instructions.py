"""Instruction-following items (IFEval's constraint vocabulary), procedurally built.

Each item asks for a short text about a topic under one layout (bullets, paragraphs,
sections, a word or sentence budget, JSON, two responses, a fixed answer, a language) and
up to two modifiers (case, commas, keywords, forbidden words, an end phrase, a postscript,
a title, highlights, placeholders). The reference is rendered to satisfy all of them; each
wrong output breaks exactly one, so every constraint's check is proven to bite.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from evals.datasets.builtin.common import BuiltinItem, make_item

SEED = 20263
TOPICS: dict[str, list[str]] = {
    "the water cycle": ["Water evaporates from oceans and lakes", "Vapour cools and forms clouds",
                        "Clouds release rain or snow", "Rivers carry water back to the sea",
                        "Plants return water to the air", "The sun drives the whole cycle"],
    "bicycle maintenance": ["Keep the chain clean and oiled", "Check the tyre pressure every week",
                            "Test both brakes before a ride", "Tighten loose bolts with care",
                            "Store the bike in a dry place", "Replace worn brake pads early"],
    "learning a language": ["Practise a little every day", "Read simple stories aloud",
                            "Learn the most common words first", "Speak with native speakers often",
                            "Write short notes in the new language", "Do not fear small mistakes"],
    "saving energy at home": ["Turn off lights in empty rooms", "Wash clothes in cold water",
                              "Seal gaps around old windows", "Use a timer for the heating",
                              "Unplug chargers when they are idle", "Choose efficient light bulbs"],
    "growing tomatoes": ["Plant them in a sunny spot", "Water the roots deeply and slowly",
                         "Support tall plants with stakes", "Remove yellow leaves promptly",
                         "Feed the soil with compost", "Pick the fruit when it is firm and red"],
    "writing clear emails": ["Put the main point in the first line", "Use a short and specific subject",
                             "Keep each paragraph brief", "Say what you need and by when",
                             "Read the message once before sending", "Avoid long chains of replies"],
}  # fmt: skip
FOREIGN: dict[str, list[str]] = {
    "fr": ["Le cycle de l'eau est un processus naturel", "Les nuages se forment quand la vapeur refroidit",
           "La pluie retourne vers les rivières et la mer", "Le soleil est la source de cette énergie"],
    "de": ["Der Wasserkreislauf ist ein natürlicher Prozess", "Die Wolken entstehen wenn der Dampf abkühlt",
           "Der Regen fließt in die Flüsse und das Meer", "Die Sonne ist die Quelle der Energie"],
    "es": ["El ciclo del agua es un proceso natural", "Las nubes se forman cuando el vapor se enfría",
           "La lluvia vuelve a los ríos y al mar", "El sol es la fuente de esta energía"],
}  # fmt: skip
LANGUAGE_NAMES = {"fr": "French", "de": "German", "es": "Spanish"}
KEYWORDS = ("lantern", "compass", "harbour", "velvet", "orbit", "meadow")
FORBIDDEN = ("basically", "literally", "awesome", "stuff")
END_PHRASE = "Is there anything else I can help with?"
TEXT_LAYOUTS = ("bullets", "paragraphs", "min_words", "max_sentences", "sections", "two_responses")
MODIFIERS = ("lowercase", "no_comma", "keywords", "forbidden", "end", "postscript", "title", "highlights",
             "placeholders")  # fmt: skip


#: Pairs whose reference could not satisfy both (bullet stars read as highlights, extra
#: lines counted as sentences, a lower-cased SECTION marker).
CLASHES = {("bullets", "highlights"), ("max_sentences", "postscript"), ("max_sentences", "end"),
           ("max_sentences", "title"), ("sections", "lowercase")}  # fmt: skip


@dataclass
class Plan:
    topic: str
    layout: str
    modifiers: list[str]
    n: int
    keywords: tuple[str, str] = ("", "")
    language: str = ""
    constraints: list[dict[str, Any]] = field(default_factory=list)
    asks: list[str] = field(default_factory=list)


def _layout(plan: Plan) -> None:
    n, c, a = plan.n, plan.constraints, plan.asks
    match plan.layout:
        case "bullets":
            c.append({"kind": "detectable_format:number_bullet_lists", "num_bullets": n})
            a.append(f"Answer with exactly {n} bullet points, using markdown bullets such as '* point'.")
        case "paragraphs":
            c.append({"kind": "length_constraints:number_paragraphs", "num_paragraphs": n})
            a.append(f"Write exactly {n} paragraphs, separated by the markdown divider ***.")
        case "min_words":
            c.append({"kind": "length_constraints:number_words", "num_words": n * 10, "relation": "at least"})
            a.append(f"Answer with at least {n * 10} words.")
        case "max_sentences":
            c.append(
                {"kind": "length_constraints:number_sentences", "num_sentences": n, "relation": "less than"}
            )
            a.append(f"Answer in fewer than {n} sentences.")
        case "sections":
            c.append(
                {
                    "kind": "detectable_format:multiple_sections",
                    "section_spliter": "SECTION",
                    "num_sections": n,
                }
            )
            a.append(f"Your response must have {n} sections; start each with SECTION X (X = 1, 2, …).")
        case "two_responses":
            c.append({"kind": "combination:two_responses"})
            a.append("Give two different responses, separated by six asterisks: ******")
        case "json":
            c.append({"kind": "detectable_format:json_format"})
            a.append("Wrap your entire output in JSON format.")
        case "constrained":
            c.append({"kind": "detectable_format:constrained_response"})
            a.append("Is it worth doing? Answer with one of: 'My answer is yes.', 'My answer is no.', "
                     "'My answer is maybe.'")  # fmt: skip
        case "language":
            c.append({"kind": "language:response_language", "language": plan.language})
            a.append(f"Respond only in {LANGUAGE_NAMES[plan.language]}; no other language is allowed.")


def _modifiers(plan: Plan) -> None:
    c, a = plan.constraints, plan.asks
    for m in plan.modifiers:
        match m:
            case "lowercase":
                c.append({"kind": "change_case:english_lowercase"})
                a.append("Your entire response must be in English and in lowercase letters only.")
            case "no_comma":
                c.append({"kind": "punctuation:no_comma"})
                a.append("Do not use any commas.")
            case "keywords":
                c.append({"kind": "keywords:existence", "keywords": list(plan.keywords)})
                a.append(f"Include the keywords '{plan.keywords[0]}' and '{plan.keywords[1]}'.")
            case "forbidden":
                c.append({"kind": "keywords:forbidden_words", "forbidden_words": list(FORBIDDEN)})
                a.append(f"Do not use the words {', '.join(FORBIDDEN)}.")
            case "end":
                c.append({"kind": "startend:end_checker", "end_phrase": END_PHRASE})
                a.append(f"Finish with the exact phrase '{END_PHRASE}' and nothing after it.")
            case "postscript":
                c.append({"kind": "detectable_content:postscript", "postscript_marker": "P.S."})
                a.append("At the end, add a postscript starting with P.S.")
            case "title":
                c.append({"kind": "detectable_format:title"})
                a.append("Give it a title wrapped in double angular brackets, such as <<my title>>.")
            case "highlights":
                c.append({"kind": "detectable_format:number_highlighted_sections", "num_highlights": 2})
                a.append("Highlight at least 2 parts with markdown, i.e. *highlighted part*.")
            case "placeholders":
                c.append({"kind": "detectable_content:number_placeholders", "num_placeholders": 2})
                a.append("Include at least 2 placeholders in square brackets, such as [name].")


def render(plan: Plan, broken: str | None = None) -> str:
    """The reply satisfying every constraint of ``plan``, or breaking exactly ``broken``."""
    facts = [s + "." for s in (FOREIGN[plan.language] if plan.language else TOPICS[plan.topic])]
    mods = set(plan.modifiers)
    if "keywords" in mods and broken != "keywords":
        facts[0] = facts[0][:-1] + f" like a {plan.keywords[0]} and a {plan.keywords[1]}."
    if "forbidden" in mods and broken == "forbidden":
        facts[0] = facts[0][:-1] + f" {FORBIDDEN[0]}."
    if "placeholders" in mods and broken != "placeholders":
        facts[1] = facts[1][:-1] + " near [your town] with [a friend]."
    if "no_comma" in mods and broken == "no_comma":
        facts[0] = facts[0][:-1] + ", of course."
    if "highlights" in mods and broken != "highlights":
        facts[0], facts[1] = f"*{facts[0]}*", f"*{facts[1]}*"
    n = plan.n + (1 if broken == plan.layout else 0)
    body = _body(plan, facts, n, broken)
    if "title" in mods and broken != "title":
        body = f"<<{plan.topic.title()}>>\n{body}"
    if "postscript" in mods and broken != "postscript":
        body += "\nP.S. Small steps add up."
    if "end" in mods and broken != "end":
        body += f"\n{END_PHRASE}"
    if "lowercase" in mods:
        body = (
            body.lower()
            if broken != "lowercase"
            else body.lower().replace(facts[0][:6].lower(), facts[0][:6].upper(), 1)
        )
    return body


def _body(plan: Plan, facts: list[str], n: int, broken: str | None) -> str:
    match plan.layout:
        case "bullets":
            return "\n".join(f"* {facts[i % len(facts)]}" for i in range(n))
        case "paragraphs":
            return "\n***\n".join(" ".join(facts[i::n]) or facts[i % len(facts)] for i in range(n))
        case "min_words":
            words = n * 10 if broken != "min_words" else plan.n * 2
            text: list[str] = []
            while len(" ".join(text).split()) < words:
                text.append(facts[len(text) % len(facts)])
            out = " ".join(text)
            return out if broken != "min_words" else " ".join(out.split()[: plan.n * 2])
        case "max_sentences":
            count = plan.n - 1 if broken != "max_sentences" else plan.n + 1
            return " ".join(facts[i % len(facts)] for i in range(count))
        case "sections":
            count = plan.n if broken != "sections" else plan.n - 1
            return "\n".join(f"SECTION {i + 1}\n{facts[i % len(facts)]}" for i in range(count))
        case "two_responses":
            if broken == "two_responses":
                return " ".join(facts)
            return " ".join(facts[:3]) + "\n******\n" + " ".join(facts[3:])
        case "json":
            payload = json.dumps({"topic": plan.topic, "points": facts})
            return payload if broken != "json" else "Sure, here it is: " + payload
        case "constrained":
            answer = "My answer is yes." + (" My answer is no." if broken == "constrained" else "")
            return f"{facts[0]} {answer}"
        case "language":
            return (
                " ".join(facts)
                if broken != "language"
                else " ".join(s + "." for s in TOPICS["the water cycle"])
            )
    raise ValueError(plan.layout)


def _plans(rng: random.Random) -> list[Plan]:
    plans: list[Plan] = []
    topics = list(TOPICS)
    for i in range(48):
        layout = TEXT_LAYOUTS[i % len(TEXT_LAYOUTS)]
        pool = [m for m in MODIFIERS if (layout, m) not in CLASHES]
        mods = rng.sample(pool, 1 + i % 2)
        plans.append(Plan(topics[i % len(topics)], layout, mods, rng.randint(3, 5),
                          tuple(rng.sample(KEYWORDS, 2))))  # type: ignore[arg-type]  # fmt: skip
    for i, lang in enumerate(("fr", "de", "es") * 2):
        plans.append(Plan("the water cycle", "language", ["no_comma"] if i % 2 else [], 3, language=lang))
    for i in range(4):
        plans.append(Plan(topics[i], "json" if i % 2 else "constrained", [], 3))
    return plans


def items() -> list[BuiltinItem]:
    rng = random.Random(SEED)
    out: list[BuiltinItem] = []
    for plan in _plans(rng):
        _layout(plan)
        _modifiers(plan)
        subject = "the water cycle" if plan.language else plan.topic
        prompt = f"Write about {subject}. " + " ".join(plan.asks)
        kinds = [plan.layout, *plan.modifiers]
        wrong = tuple(render(plan, broken=k) for k in kinds)
        scorer = {"type": "constraints", "constraints": plan.constraints}
        out.append(make_item(f"if-{len(out) + 1:03d}", "instruction_following", prompt, scorer, render(plan),
                             wrong, {"layout": plan.layout, "modifiers": plan.modifiers}))  # fmt: skip
    return out
