"""Training prompts: real, offline, and disjoint from the evaluation prompts.

Three kinds, the kinds of request the evaluation makes (math, code, chat), none taken from the
evaluation sets (../shared/data/prompts/ is never read for training or calibration; `check_disjoint`
only verifies that no prompt built here repeats one of them):

* code: the Python standard library's own functions (ast over the installed stdlib sources): their
  first docstring line becomes "Write a Python function ..." requests, their signature and
  docstring a "complete this function" problem, short sources "explain this code" or "write tests
  for this" requests.
* math: arithmetic word problems from our own templates with random numbers (shopping, rates,
  work, ages, percentages, fractions, time, geometry), asking for step-by-step reasoning with the
  final answer in \\boxed{} (the instruction style of math benchmarks).
* chat: writing, explanation, advice, comparison, role-play and extraction requests from our own
  templates over topic words (a list below, plus pydoc_data.topics' Python topics and stdlib
  module docstrings as texts to summarise or extract from).

Every prompt has a stable id; the split (train / calib / eval) is a hash of the id, so adding
prompts never moves another prompt between splits.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import re
import sysconfig
from pathlib import Path

SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__",
             "encodings", "turtledemo", "lib2to3", "idlelib", "tkinter", "ensurepip"}

BOXED = "Please reason step by step, and put your final answer within \\boxed{}."


def _split_of(pid: str, calib_frac: float, eval_frac: float) -> str:
    h = int(hashlib.sha1(pid.encode()).hexdigest(), 16) % 10000 / 10000.0
    if h < eval_frac:
        return "eval"
    if h < eval_frac + calib_frac:
        return "calib"
    return "train"


# ----------------------------------------------------------------------------------------------
# code


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if any(part in SKIP_DIRS for part in rel.parts) or rel.parts[0].startswith("test"):
            continue
        try:
            if not 200 <= p.stat().st_size <= 400_000:
                continue
        except OSError:
            continue
        out.append(p)
    return out


def _signature(fn: ast.FunctionDef) -> str:
    a = fn.args
    parts = []
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    for arg, d in zip(pos, defaults):
        if arg.arg in ("self", "cls"):
            continue
        s = arg.arg
        if arg.annotation is not None:
            s += ": " + ast.unparse(arg.annotation)
        if d is not None:
            s += "=" + ast.unparse(d)
        parts.append(s)
    if a.vararg:
        parts.append("*" + a.vararg.arg)
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        s = arg.arg + ("=" + ast.unparse(d) if d is not None else "")
        parts.append(s)
    if a.kwarg:
        parts.append("**" + a.kwarg.arg)
    ret = " -> " + ast.unparse(fn.returns) if fn.returns is not None else ""
    return f"def {fn.name}({', '.join(parts)}){ret}:"


def _first_sentence(doc: str) -> str:
    first = doc.strip().split("\n\n")[0]
    first = " ".join(first.split())
    m = re.match(r"(.+?[.!?])(\s|$)", first)
    return (m.group(1) if m else first).strip()


VERBS = {"return", "compute", "convert", "create", "get", "set", "read", "write", "make", "find",
         "check", "parse", "build", "remove", "add", "format", "encode", "decode", "split", "join",
         "test", "load", "save", "open", "close", "copy", "generate", "calculate", "count", "extract",
         "update", "send", "print", "apply", "register", "validate", "translate", "quote", "unquote",
         "escape", "normalize", "strip", "replace", "search", "match", "sort", "merge", "compare",
         "wrap", "fill", "list", "insert", "delete", "move", "rename", "change", "reset", "start",
         "stop", "run", "call", "yield", "iterate", "produce", "determine", "construct", "initialize",
         "store", "fetch", "resolve", "expand", "shorten", "truncate", "pad", "round", "scale"}


_PARSED: list = []


def _parsed_stdlib() -> list:
    """(path, source, tree) of every stdlib file used, parsed once."""
    if not _PARSED:
        for path in _stdlib_files():
            try:
                src = path.read_text(encoding="utf-8")
                _PARSED.append((path, src, ast.parse(src)))
            except (UnicodeDecodeError, SyntaxError, ValueError):
                continue
    return _PARSED


def _as_infinitive(sent: str):
    """'Return the x.' / 'Returns the x.' -> 'return the x'; None when it does not start with a verb."""
    words = sent.rstrip(".").split(" ", 1)
    w = words[0].lower()
    if w not in VERBS and w.endswith("s") and w[:-1] in VERBS:
        w = w[:-1]
    elif w not in VERBS and w.endswith("es") and w[:-2] in VERBS:
        w = w[:-2]
    if w not in VERBS:
        return None
    return w + (" " + words[1] if len(words) > 1 else "")


def code_prompts(rng: random.Random) -> list[dict]:
    import textwrap

    out = []
    seen = set()
    for path, src, tree in _parsed_stdlib():
        mod = path.stem
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("__"):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) < 20:
                continue
            sent = _first_sentence(doc)
            if not 15 <= len(sent) <= 220 or sent.lower().startswith(("deprecated", "internal", "helper")):
                continue
            key = (node.name, sent)
            if key in seen:
                continue
            seen.add(key)
            body = textwrap.dedent(" " * node.col_offset + (ast.get_source_segment(src, node) or ""))
            name = node.name.lstrip("_")
            sig = _signature(node)
            pid = f"code:{mod}:{node.name}:{node.lineno}"
            verb = _as_infinitive(sent)
            choice = rng.random()
            if choice < 0.35:
                options = [f"Write a Python function `{name}` that does the following: {sent}",
                           f"Implement a Python function named {name}. {sent}"]
                if verb:
                    options += [f"Write a python function to {verb}.",
                                f"Write a function to {verb}.",
                                f"Write a Python function {name}() to {verb}. Include a docstring."]
                text = rng.choice(options)
            elif choice < 0.70:
                docblock = "\n".join("    " + ln if ln else "" for ln in doc.strip().split("\n")[:12])
                problem = f"{sig}\n    \"\"\"\n{docblock}\n    \"\"\"\n"
                text = rng.choice([
                    "Write a solution to the following problem:\n```python\n{p}```",
                    "Complete the following Python function so that it does what its docstring says:\n```python\n{p}```",
                    "Implement this function:\n```python\n{p}```\nExplain your solution briefly.",
                ]).format(p=problem)
            elif choice < 0.88 and 80 <= len(body) <= 1400:
                text = rng.choice([
                    "Explain what the following Python code does:\n```python\n{b}\n```",
                    "Review this Python function and suggest improvements:\n```python\n{b}\n```",
                    "Write unit tests with pytest for this function:\n```python\n{b}\n```",
                ]).format(b=body)
            else:
                options = [f"In Python's {mod} module, what does `{node.name}` do? Show an example of how it could be used."]
                if verb:
                    options.append(f"How would you {verb} in Python? Give a short code example.")
                text = rng.choice(options)
            out.append({"id": pid, "kind": "code", "text": text})
    return out


# ----------------------------------------------------------------------------------------------
# math

NAMES = ["Ava", "Ben", "Carla", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kofi",
         "Lena", "Mateo", "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tara", "Umar", "Vera",
         "Wen", "Xavier", "Yara", "Zoe", "Liam", "Maya", "Noah", "Olga"]
ITEMS = [("apple", "apples"), ("notebook", "notebooks"), ("pencil", "pencils"), ("cupcake", "cupcakes"),
         ("ticket", "tickets"), ("book", "books"), ("shirt", "shirts"), ("plant", "plants"),
         ("candle", "candles"), ("toy car", "toy cars"), ("bag of rice", "bags of rice"),
         ("jar of honey", "jars of honey"), ("mango", "mangoes"), ("sticker", "stickers"),
         ("loaf of bread", "loaves of bread"), ("bottle of water", "bottles of water")]
ANIMALS = ["chickens", "cows", "goats", "sheep", "ducks", "rabbits", "horses", "pigs"]
JOBS = ["painting a fence", "mowing lawns", "walking dogs", "tutoring", "babysitting",
        "delivering newspapers", "washing cars", "fixing bikes"]


def _math_problem(rng: random.Random) -> str:
    n = rng.choice(NAMES)
    m = rng.choice([x for x in NAMES if x != n])
    it, its = rng.choice(ITEMS)
    r = rng.randint
    t = r(0, 21)
    if t == 0:
        return (f"{n} buys {r(2, 12)} {its} at ${r(1, 9)} each and {r(2, 8)} {rng.choice(ITEMS)[1]} at "
                f"${r(2, 15)} each. {n} pays with a ${rng.choice([50, 100, 200])} bill. How much change does {n} get?")
    if t == 1:
        return (f"A farm has {r(10, 90)} {rng.choice(ANIMALS)} and {r(2, 6)} times as many {rng.choice(ANIMALS)}. "
                f"The farmer sells {r(5, 40)} of the animals. How many animals are left on the farm?")
    if t == 2:
        return (f"{n} earns ${r(8, 30)} per hour {rng.choice(JOBS)}. {n} works {r(2, 8)} hours a day for "
                f"{r(3, 6)} days a week. How much does {n} earn in {r(2, 8)} weeks?")
    if t == 3:
        return (f"A train travels at {r(40, 120)} km per hour for {r(2, 6)} hours and then at {r(30, 90)} km per "
                f"hour for {r(1, 5)} more hours. How far does it travel in total?")
    if t == 4:
        return (f"{n} is {r(5, 15)} years old. {m} is {r(2, 4)} times as old as {n}. How old will {m} be "
                f"in {r(3, 12)} years?")
    if t == 5:
        return (f"A store sells a {it} for ${r(20, 200)}. During a sale the price is reduced by "
                f"{rng.choice([10, 15, 20, 25, 30, 40, 50])}%. {n} buys {r(2, 5)} of them. How much does {n} pay?")
    if t == 6:
        return (f"{n} has {r(20, 120)} {its}. {n} gives {rng.choice(['a quarter', 'a third', 'half', 'a fifth'])} "
                f"of them to {m} and then buys {r(3, 25)} more. How many {its} does {n} have now?")
    if t == 7:
        return (f"A rectangular garden is {r(5, 40)} meters long and {r(3, 25)} meters wide. Fencing costs "
                f"${r(3, 15)} per meter. How much does it cost to fence the whole garden?")
    if t == 8:
        return (f"{n} reads {r(10, 60)} pages every weekday and {r(20, 90)} pages on each day of the weekend. "
                f"How many pages does {n} read in {r(2, 5)} weeks?")
    if t == 9:
        return (f"A bakery makes {r(100, 600)} {its} a day. It sells {r(50, 95)}% of them and donates the rest. "
                f"How many does it donate in a {rng.choice([5, 6, 7])}-day week?")
    if t == 10:
        return (f"{n} saves ${r(5, 40)} every week. {n} wants to buy a bike that costs ${r(150, 900)} and already "
                f"has ${r(10, 100)}. How many weeks does {n} need to save?")
    if t == 11:
        return (f"Three friends share a bill of ${r(30, 300)}. {n} pays twice as much as {m}, and the third "
                f"friend pays ${r(5, 30)}. How much does {m} pay?")
    if t == 12:
        return (f"A tank holds {r(100, 1000)} liters of water. It leaks {r(2, 15)} liters per hour and is refilled "
                f"with {r(20, 80)} liters every {r(3, 8)} hours. How much water is in the tank after {r(10, 30)} hours "
                f"if it starts full and never overflows?")
    if t == 13:
        return (f"{n} runs {r(2, 12)} kilometers on Monday, {r(10, 60)}% more on Tuesday, and half of Tuesday's "
                f"distance on Wednesday. How many kilometers does {n} run in the three days?")
    if t == 14:
        return (f"A class has {r(20, 40)} students. {r(20, 80)}% of them are in the chess club and a third of those "
                f"are also in the robotics club. How many students are in both clubs?")
    if t == 15:
        return (f"{n} bakes {r(3, 12)} trays of {its} with {r(6, 24)} on each tray. {n} keeps {r(5, 20)} and "
                f"packs the rest into boxes of {r(4, 12)}. How many full boxes does {n} pack?")
    if t == 16:
        return (f"A car uses {r(5, 12)} liters of fuel per 100 km. Fuel costs ${r(1, 3)}.{r(10, 99)} per liter. "
                f"How much does fuel cost for a {r(150, 1200)} km trip?")
    if t == 17:
        return (f"{n} plants {r(4, 20)} rows of {its} with {r(5, 30)} in each row. {r(5, 30)}% of them do not grow. "
                f"How many grow?")
    if t == 18:
        return (f"A movie starts at {r(1, 9)}:{rng.choice(['00', '15', '30', '45'])} pm and lasts {r(85, 190)} minutes. "
                f"{n} needs {r(10, 45)} minutes to get home afterwards. At what time does {n} get home?")
    if t == 19:
        return (f"The sum of two numbers is {r(20, 200)} and their difference is {r(2, 18) * 2}. "
                f"What are the two numbers?")
    if t == 20:
        return (f"{n} invests ${r(1, 20) * 500} at {r(2, 9)}% simple interest per year. How much interest does "
                f"{n} earn in {r(2, 10)} years?")
    return (f"{n} and {m} collect {its}. {n} has {r(10, 80)} and {m} has {r(5, 40)} fewer than twice as many as "
            f"{n}. How many {its} do they have together?")


def math_prompts(rng: random.Random, n: int) -> list[dict]:
    out = []
    seen = set()
    for i in range(n * 5):
        if len(out) >= n:
            break
        q = _math_problem(rng)
        if q in seen:
            continue
        seen.add(q)
        style = rng.random()
        if style < 0.7:
            text = f"{q}\n{BOXED}"
        elif style < 0.85:
            text = f"Solve this problem step by step: {q}"
        else:
            text = q
        out.append({"id": f"math:{i}", "kind": "math", "text": text})
    return out


# ----------------------------------------------------------------------------------------------
# chat

TOPICS = [
    "renewable energy", "the history of the printing press", "climate change", "electric cars",
    "remote work", "the water cycle", "photosynthesis", "black holes", "the Roman Empire",
    "machine learning", "healthy sleep habits", "learning a new language", "public transportation",
    "coral reefs", "the Industrial Revolution", "volcanoes", "social media", "meditation",
    "space exploration", "recycling", "the immune system", "urban gardening", "the stock market",
    "ancient Egypt", "jazz music", "the French Revolution", "artificial intelligence ethics",
    "bees and pollination", "time management", "budgeting for students", "3D printing",
    "the human brain", "ocean tides", "the Renaissance", "vaccines", "cybersecurity",
    "minimalism", "marathon training", "the history of chess", "quantum computing",
    "desert ecosystems", "the Silk Road", "volunteering", "impressionist painting",
    "the invention of the telephone", "plate tectonics", "fast fashion", "video game design",
    "the Great Barrier Reef", "cooking with kids", "public speaking", "wind turbines",
    "the Moon landing", "antibiotic resistance", "carbon footprints", "online privacy",
    "the Olympic Games", "rainforests", "blockchain", "mental health at work",
    "the history of the bicycle", "solar panels", "migratory birds", "supply chains",
    "the Amazon river", "digital photography", "team sports", "classical music",
    "the Internet of Things", "inflation", "the periodic table", "glaciers",
    "electric guitars", "small business marketing", "wildfires", "the printing of money",
    "honeybees", "hiking safety", "board games", "the Cold War", "nuclear energy",
    "sustainable farming", "self-driving cars", "the human heart", "poetry", "tea culture",
    "the history of mathematics", "earthquakes", "job interviews", "open source software",
]
PLACES = ["Kyoto", "Lisbon", "Iceland", "Patagonia", "Morocco", "New Zealand", "the Scottish Highlands",
          "Vietnam", "Peru", "Norway", "Cape Town", "Istanbul", "the Canadian Rockies", "Sicily",
          "Mexico City", "Bali", "Prague", "the Swiss Alps"]
ROLES = ["a pirate captain", "a medieval knight", "a detective in 1920s London", "a friendly robot",
         "a tour guide", "a chef in a busy restaurant", "an astronaut on the space station",
         "a museum curator", "a wise old wizard", "a sports commentator"]
PEOPLE = ["your manager", "a new colleague", "your landlord", "a customer", "your professor",
          "a neighbour", "the school principal", "a hiring manager"]

CHAT_TEMPLATES = [
    "Write a short blog post about {t}.",
    "Explain {t} to a ten-year-old.",
    "What are the main advantages and disadvantages of {t}?",
    "Give me five interesting facts about {t}.",
    "Write a short poem about {t}.",
    "Write a persuasive paragraph arguing that more people should learn about {t}.",
    "Summarize the key ideas behind {t} in a few bullet points.",
    "Compare {t} and {u}. How are they similar and how are they different?",
    "I am giving a five-minute talk on {t}. Draft an outline with an introduction, three main points and a conclusion.",
    "What are some common misconceptions about {t}?",
    "Write a short story in which {t} plays an important role.",
    "How has {t} changed over the last hundred years?",
    "Describe {t} in three sentences, then explain why it matters.",
    "Create a quiz with five multiple-choice questions about {t}, with the answers.",
    "Compose an engaging travel blog post about a trip to {p}, highlighting the culture and the sights.",
    "Plan a three-day itinerary for a visit to {p}.",
    "Pretend you are {r}. Describe your typical day.",
    "Act as {r} and give advice to someone who is nervous about {t}.",
    "Draft a polite email to {w} asking for feedback on a report about {t}. Keep it short.",
    "Write a professional email to {w} explaining that a project will be delayed by two weeks.",
    "Give me a step-by-step plan to get started with {t}.",
    "What questions should I ask an expert on {t}?",
    "Write a product description for a new gadget related to {t}.",
    "Rewrite the following sentence in a more formal tone: \"{t} is really cool and everyone should check it out.\"",
    "Imagine you are writing a magazine article about {t}. Write the opening paragraph.",
    "Which ethical questions does {t} raise?",
]


def _pydoc_topics() -> list[tuple[str, str]]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # pragma: no cover
        return []
    out = []
    for key, text in sorted(topics.items()):
        first = text.strip().split("\n\n")
        body = " ".join(" ".join(first[1:3]).split()) if len(first) > 1 else ""
        title = re.sub(r"[*=~^-]{3,}", "", " ".join(first[0].split())).strip()
        if 10 <= len(body):
            out.append((title, body[:900]))
    return out


def _module_docs() -> list[tuple[str, str]]:
    out = []
    for path, _src, tree in _parsed_stdlib():
        doc = ast.get_docstring(tree)
        if doc and 300 <= len(doc) <= 2500:
            out.append((path.stem, doc))
    return out


def chat_prompts(rng: random.Random, n: int) -> list[dict]:
    out = []
    seen = set()
    topics = _pydoc_topics()
    docs = _module_docs()
    for i in range(n * 20):
        if len(out) >= n:
            break
        u = rng.random()
        if u < 0.72:
            t = rng.choice(TOPICS)
            text = rng.choice(CHAT_TEMPLATES).format(
                t=t, u=rng.choice([x for x in TOPICS if x != t]), p=rng.choice(PLACES),
                r=rng.choice(ROLES), w=rng.choice(PEOPLE))
        elif u < 0.87 and topics:
            title, body = rng.choice(topics)
            text = rng.choice([
                f"Explain the Python concept \"{title}\" with a simple example.",
                f"Here is an excerpt from the Python documentation:\n\n{body}\n\nExplain it in plain words.",
                f"What is \"{title}\" in Python, and when would I use it?",
            ])
        elif docs:
            name, doc = rng.choice(docs)
            text = rng.choice([
                f"Summarize the following text in two or three sentences:\n\n{doc}",
                f"Extract the main points of this documentation as a bulleted list:\n\n{doc}",
                f"Read this description of the Python module {name} and list three things it can be used for:\n\n{doc}",
            ])
        else:
            text = rng.choice(CHAT_TEMPLATES).format(t=rng.choice(TOPICS), u=rng.choice(TOPICS),
                                                     p=rng.choice(PLACES), r=rng.choice(ROLES),
                                                     w=rng.choice(PEOPLE))
        if text not in seen:
            seen.add(text)
            out.append({"id": f"chat:{i}", "kind": "chat", "text": text})
    return out


# ----------------------------------------------------------------------------------------------


def build_prompts(n: int, seed: int, mix=(0.35, 0.30, 0.35), calib_frac: float = 0.06,
                  eval_frac: float = 0.03) -> list[dict]:
    """n prompts (code, math, chat in proportions `mix`), deduplicated, shuffled with `seed`, each
    with its split. Deterministic for a given n, seed and Python version (stdlib sources)."""
    rng = random.Random(seed)
    n_code = int(round(n * mix[0]))
    n_math = int(round(n * mix[1]))
    n_chat = n - n_code - n_math
    code = code_prompts(random.Random(seed + 1))
    random.Random(seed + 2).shuffle(code)
    code = code[:n_code]
    n_chat += n_code - len(code)  # the stdlib ran out of functions: more chat instead
    prompts = code + math_prompts(random.Random(seed + 3), n_math) + chat_prompts(random.Random(seed + 4), n_chat)
    seen, uniq = set(), []
    for p in prompts:
        if p["text"] not in seen:
            seen.add(p["text"])
            uniq.append(p)
    rng.shuffle(uniq)
    for p in uniq:
        p["split"] = _split_of(p["id"], calib_frac, eval_frac)
    _PARSED.clear()  # the parsed stdlib is large; the prompts are all that is needed
    return uniq


def check_disjoint(prompts: list[dict], eval_dir: str) -> int:
    """Number of our prompts that repeat an evaluation prompt (first turn, whitespace-normalised,
    either way contained). Only reads eval_dir to check; 0 expected."""
    if not os.path.isdir(eval_dir):
        return 0
    norm = lambda s: " ".join(s.split()).lower()
    evals = set()
    for f in sorted(Path(eval_dir).glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            try:
                turns = json.loads(line).get("turns") or []
            except json.JSONDecodeError:
                continue
            for t in turns:
                s = norm(t)
                if len(s) >= 40:
                    evals.add(s[:200])
    hits = 0
    for p in prompts:
        s = norm(p["text"])
        if any(e in s or s[:200] == e for e in evals):
            hits += 1
    return hits


if __name__ == "__main__":  # a look at what comes out
    import sys

    ps = build_prompts(int(sys.argv[1]) if len(sys.argv) > 1 else 30, 1234)
    for p in ps:
        print(json.dumps(p)[:400])
