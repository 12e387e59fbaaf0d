"""The bundled offline sites and their tasks, generated from a seed: `python -m jaxwebrl.env.tasks.sites.generate`.

Three small multi-page websites (static files under `pages/`, played via file://; the allowlist confines a task to
the sites' folder and the request guard refuses everything else, so no request leaves the machine):

    shop/   a catalogue: four categories of six products (price, rating, stock), each category sortable by price
    wiki/   an encyclopedia of 20 fictional towns (founded, population, river), cross-linked by "See also"
    docs/   a documentation site of 16 options (default, related option) with a search box

and `tasks.jsonl`: 63 tasks in WebGym's own format (task_name, website, domain, subdomain, evaluator_reference,
reference_answer, task_id) over easy / medium / hard, each also carrying its programmatic
`ground_truth` (the answer) and a `solution` (the oracle's plan: clicks and typing on CSS selectors, then the
answer; `jaxwebrl.env.tasks.webgym.oracle`). The facts of a task are one per page it must reach plus the answer,
so WebGym's rule (easy 1-3 facts, medium 4-6, hard 7+) gives its difficulty (no record states one). The output is a function of SEED
only: tests/env/test_sites.py regenerates it and compares.
"""

from __future__ import annotations

import html
import json
import os

import numpy as np

SEED = 42
HERE = os.path.dirname(os.path.abspath(__file__))
# Every link, button and input is at least 110 x 80 px: larger than a cell of the 10 x 10 click grid on the 1024 x 768
# viewport (103 x 77 px), so the grid point nearest its centre lies inside it and a constrained policy can hit it.
TARGET = "display:inline-block;box-sizing:border-box;min-width:110px;min-height:80px;line-height:80px;padding:0 16px;"
STYLE = ("body{font:18px sans-serif;margin:8px 24px;background:#fafafa}h1{font-size:26px;margin:4px 0}"
         f"a{{{TARGET}color:#1a4fd0;background:#e8eefc;margin:2px}}button,input{{{TARGET}font-size:18px}}"
         "ul{list-style:none;padding:0;margin:0}li{display:inline-block}table{border-collapse:collapse}"
         "td{padding:0 14px;border:1px solid #ccc}p{margin:4px 0}")
CATEGORIES = ("Kitchen", "Garden", "Office", "Toys")
ITEMS = {"Kitchen": ("Mug", "Kettle", "Teapot", "Bowl", "Ladle", "Toaster"),
         "Garden": ("Rake", "Hose", "Shovel", "Planter", "Trowel", "Sprinkler"),
         "Office": ("Stapler", "Lamp", "Binder", "Chair", "Notebook", "Clock"),
         "Toys": ("Kite", "Puzzle", "Robot", "Yo-yo", "Train", "Ball")}
COLOURS = ("Red", "Blue", "Green", "Yellow", "Black", "White")
TOWNS = ("Alder", "Brackwater", "Cinderford", "Dunmere", "Eastholm", "Fallowby", "Greyhaven", "Hollin", "Ivybridge",
         "Juniper", "Kestrel", "Larkspur", "Millbrook", "Northwick", "Oakhurst", "Pennyfield", "Quarryton",
         "Rosedale", "Stonebury", "Thornbury")
RIVERS = ("Avon", "Brent", "Colne", "Dart", "Exe", "Frome")
OPTIONS = ("cache_size", "max_retries", "timeout_ms", "log_level", "batch_size", "worker_count", "buffer_bytes",
           "flush_interval", "compression", "listen_port", "queue_depth", "trace_sampling", "shard_count",
           "lease_seconds", "replica_count", "gc_interval")


def _page(title: str, body: str, nav: str = "") -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{nav}<h1>{html.escape(title)}</h1>{body}</body></html>\n")


def _slug(text: str) -> str:
    return text.lower().replace(" ", "-")


def _task(task_id, name, site, page, facts, answer, solution, subdomain) -> dict:
    return {"task_id": task_id, "task_name": name, "website": f"pages/{site}/{page}", "domain": site,
            "subdomain": subdomain, "evaluator_reference": facts, "reference_answer": answer,
            "ground_truth": {"answer": answer, "mode": "exact"}, "solution": solution}


def shop(rng) -> tuple[dict, list]:
    """The shop's pages and its tasks: a product's price (easy), the cheapest / dearest of a category (medium)."""
    pages, tasks, products = {}, [], []
    for category in CATEGORIES:
        colours = rng.permutation(COLOURS)
        for item, colour in zip(ITEMS[category], colours):
            products.append({"name": f"{colour} {item}", "category": category, "price": f"{rng.integers(300, 9000) / 100:.2f}",
                             "rating": f"{rng.integers(10, 50) / 10:.1f}", "stock": int(rng.integers(0, 40))})
    for i, p in enumerate(products):
        p["page"] = f"product-{i}.html"
    nav = "<div class='nav'><a id='home' href='index.html'>Shop home</a></div>"
    links = "".join(f"<li><a id='cat-{_slug(c)}' href='category-{_slug(c)}.html'>{c}</a></li>" for c in CATEGORIES)
    pages["index.html"] = _page("Shop", f"<p>Browse a category:</p><ul>{links}</ul>")
    for category in CATEGORIES:
        mine = [p for p in products if p["category"] == category]
        for suffix, ordered, other in (("", mine, "by-price"),
                                       ("-by-price", sorted(mine, key=lambda p: float(p["price"])), "")):
            rows = "".join(f"<tr><td><a class='product' href='{p['page']}'>{p['name']}</a></td><td>{p['price']}</td>"
                           f"</tr>" for p in ordered)
            toggle = (f"<a id='sort' href='category-{_slug(category)}-by-price.html'>Sort by price (lowest first)</a>"
                      if other else f"<a id='unsort' href='category-{_slug(category)}.html'>Default order</a>")
            pages[f"category-{_slug(category)}{suffix}.html"] = _page(
                category, f"<table>{rows}</table>", nav.replace("</div>", toggle + "</div>"))
    for p in products:
        pages[p["page"]] = _page(p["name"], (
            f"<table><tr><td>Category</td><td>{p['category']}</td></tr><tr><td>Price</td><td>{p['price']}</td></tr>"
            f"<tr><td>Rating</td><td id='rating'>{p['rating']}</td></tr><tr><td>In stock</td><td>{p['stock']}</td>"
            f"</tr></table>"), nav)
    for n, i in enumerate(rng.choice(len(products), 12, replace=False)):
        p = products[int(i)]
        cat = f"#cat-{_slug(p['category'])}"
        tasks.append(_task(f"shop-price-{n:02d}", f"On the shop site, find the price of the {p['name']} and answer "
                           f"with it (just the number).", "shop", "index.html",
                           [f"The agent opened the {p['category']} category", f"The agent opened the {p['name']} page",
                            f"The answer is its price, {p['price']}"], p["price"],
                           [{"click": cat}, {"click": f"a.product[href='{p['page']}']"}, {"answer": p["price"]}],
                           p["category"].lower()))
    for category in CATEGORIES:
        ordered = sorted((p for p in products if p["category"] == category), key=lambda p: float(p["price"]))
        for which, target, pick in (("cheapest", ordered[0], "first-child"), ("most expensive", ordered[-1],
                                                                              "last-child")):
            tasks.append(_task(
                f"shop-{_slug(which)}-{_slug(category)}", f"On the shop site, find the {which} product in the "
                f"{category} category and answer with its rating.", "shop", "index.html",
                [f"The agent opened the {category} category", "The agent sorted it by price",
                 f"The agent opened the {which} product, the {target['name']}",
                 f"The answer is its rating, {target['rating']}"], target["rating"],
                [{"click": f"#cat-{_slug(category)}"}, {"click": "#sort"},
                 {"click": f"tr:nth-child({len(ordered) if pick == 'last-child' else 1}) a.product"},
                 {"answer": target["rating"]}], category.lower()))
    return pages, tasks


def wiki(rng) -> tuple[dict, list]:
    """The encyclopedia's pages and its tasks: follow "See also" 1 (easy), 3 (medium) or 6 (hard) times."""
    pages, tasks = {}, []
    order = [int(i) for i in rng.permutation(len(TOWNS))]
    see_also = {order[i]: order[(i + 1) % len(order)] for i in range(len(order))}   # one cycle through all towns
    facts = [{"founded": int(rng.integers(900, 1900)), "population": int(rng.integers(800, 90000)),
              "river": RIVERS[int(rng.integers(len(RIVERS)))]} for _ in TOWNS]
    nav = "<div class='nav'><a id='home' href='index.html'>Encyclopedia home</a></div>"
    links = "".join(f"<li><a id='town-{i}' href='town-{i}.html'>{t}</a></li>" for i, t in enumerate(TOWNS))
    pages["index.html"] = _page("Encyclopedia of towns", f"<ul>{links}</ul>")
    for i, town in enumerate(TOWNS):
        f, nxt = facts[i], see_also[i]
        other = (i + 7) % len(TOWNS)
        pages[f"town-{i}.html"] = _page(town, (
            f"<p>{town} is a town on the river {f['river']}, founded in <b id='founded'>{f['founded']}</b>. "
            f"Population: {f['population']}. It trades with <a href='town-{other}.html'>{TOWNS[other]}</a>.</p>"
            f"<p>See also: <a id='see-also' href='town-{nxt}.html'>{TOWNS[nxt]}</a></p>"), nav)
    for hops, level, count in ((1, "easy", 9), (3, "medium", 9), (6, "hard", 9)):
        for n, start in enumerate(int(s) for s in rng.choice(len(TOWNS), count, replace=False)):
            path = [start]
            for _ in range(hops):
                path.append(see_also[path[-1]])
            answer = str(facts[path[-1]]["founded"])
            tasks.append(_task(
                f"wiki-{level}-{n:02d}", f"In the encyclopedia, open the article on {TOWNS[start]}, follow its "
                f"'See also' link {hops} time{'s' if hops > 1 else ''} and answer with the founding year of the "
                f"town you reach.", "wiki", "index.html",
                [f"The agent opened the article on {TOWNS[start]}"]
                + [f"The agent followed 'See also' to {TOWNS[t]}" for t in path[1:]]
                + [f"The answer is {TOWNS[path[-1]]}'s founding year, {answer}"], answer,
                [{"click": f"#town-{start}"}] + [{"click": "#see-also"}] * hops + [{"answer": answer}], level))
    return pages, tasks


SEARCH_JS = """<script>
const OPTIONS = OPTION_LIST;
function search() {
  const q = document.getElementById('q').value.trim().toLowerCase();
  const hits = OPTIONS.filter(o => q && o.includes(q));
  document.getElementById('results').innerHTML = hits.length ? hits.map(
    o => `<li><a class="result" href="option-${o}.html">${o}</a></li>`).join('') : '<li>No results</li>';
}
</script>"""


def docs(rng) -> tuple[dict, list]:
    """The documentation site and its tasks: search an option's default (easy), or its related option's (medium)."""
    pages, tasks = {}, []
    defaults = {o: str(int(rng.integers(1, 500)) * (10 if i % 3 == 0 else 1)) for i, o in enumerate(OPTIONS)}
    related = {o: OPTIONS[(i + 5) % len(OPTIONS)] for i, o in enumerate(OPTIONS)}
    nav = "<div class='nav'><a id='home' href='index.html'>Docs home</a></div>"
    search = SEARCH_JS.replace("OPTION_LIST", json.dumps(list(OPTIONS)))
    pages["index.html"] = _page("Configuration reference", (
        "<p>Search the options by name:</p><form onsubmit='search(); return false;'><input id='q' size='24'> "
        "<button id='go' type='submit'>Search</button></form><ul id='results'></ul>" + search))
    for o in OPTIONS:
        pages[f"option-{o}.html"] = _page(o, (
            f"<p>Default: <b id='default'>{defaults[o]}</b></p><p>Sets the {o.replace('_', ' ')} of the service.</p>"
            f"<p>Related: <a id='related' href='option-{related[o]}.html'>{related[o]}</a></p>"), nav)
    picked = [OPTIONS[int(i)] for i in rng.choice(len(OPTIONS), 16, replace=False)]
    for n, o in enumerate(picked[:10]):
        tasks.append(_task(
            f"docs-default-{n:02d}", f"In the configuration reference, search for the option {o} and answer with "
            f"its default value.", "docs", "index.html",
            [f"The agent searched for {o}", f"The agent opened the {o} page", f"The answer is {defaults[o]}"],
            defaults[o], [{"type": ["#q", o]}, {"click": "#go"}, {"click": f"a.result[href='option-{o}.html']"},
                          {"answer": defaults[o]}], "search"))
    for n, o in enumerate(picked[10:]):
        r = related[o]
        tasks.append(_task(
            f"docs-related-{n:02d}", f"In the configuration reference, find the option {o}, follow its related "
            f"option and answer with that option's default value.", "docs", "index.html",
            [f"The agent searched for {o}", f"The agent opened the {o} page", f"The agent followed Related to {r}",
             f"The answer is {r}'s default, {defaults[r]}"], defaults[r],
            [{"type": ["#q", o]}, {"click": "#go"}, {"click": f"a.result[href='option-{o}.html']"},
             {"click": "#related"}, {"answer": defaults[r]}], "related"))
    return pages, tasks


def generate(seed: int = SEED) -> tuple[dict[str, str], list[dict]]:
    """{path under the sites folder: file text} and the task records, a function of `seed` only."""
    rng = np.random.default_rng(seed)
    files: dict[str, str] = {}
    records: list[dict] = []
    for site, build in (("shop", shop), ("wiki", wiki), ("docs", docs)):
        pages, tasks = build(rng)
        files.update({f"pages/{site}/{name}": text for name, text in pages.items()})
        records.extend(tasks)
    files["tasks.jsonl"] = "".join(json.dumps(r) + "\n" for r in records)
    return files, records


def write(root: str = HERE, seed: int = SEED) -> int:
    """Write the sites and tasks.jsonl under `root`; returns the number of tasks."""
    files, records = generate(seed)
    for path, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
        with open(os.path.join(root, path), "w", encoding="utf-8") as f:
            f.write(text)
    return len(records)


if __name__ == "__main__":
    print(f"{write()} tasks written under {HERE}")
