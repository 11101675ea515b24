"""Reference cases for constrained JSON generation (crates/engine/tests/json_schema.rs): schemas
made by pydantic (and by the `openai` client's strict transformation, what its `parse` sends),
documents built from valid instances and mutated, each labelled valid or not by the `jsonschema`
package (Draft 2020-12). Documents are compact JSON, integers without fractions, and objects
without keys the schema does not declare (the forms a generating model writes). Writes
fixtures/json-schema/cases.json: [{name, schema, docs: [{text, valid}]}].

    python3 -m venv /tmp/v && /tmp/v/bin/pip install pydantic jsonschema openai
    /tmp/v/bin/python tools/golden/json_schema_cases.py
"""

import copy
import json
from enum import Enum
from typing import Literal, Optional, Union

import jsonschema
from openai.lib._pydantic import to_strict_json_schema
from pydantic import BaseModel, ConfigDict, Field


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Kind(str, Enum):
    book = "book"
    film = "film"


class Person(Closed):
    name: str
    born: Optional[int] = None


class Work(Closed):
    title: str = Field(max_length=12)
    kind: Kind
    year: int
    rating: float
    tags: list[str] = Field(max_length=3)
    authors: list[Person] = Field(min_length=1)
    done: bool
    medium: Literal["paper", "screen"]
    note: Union[str, int, None] = None


class Tree(Closed):
    label: str
    children: list["Tree"] = []


class Scores(Closed):
    by_name: dict[str, int]
    pair: list[float] = Field(min_length=2, max_length=2)


def mutations(doc):
    """Documents near `doc`: each key dropped, each value replaced by values of other types,
    arrays grown and emptied, strings lengthened."""
    out = []
    others = [None, True, 3, -2.5, "x", [], {}, "a" * 20, [1, 2, 3, 4], {"name": "n"}]

    def visit(path, node):
        def put(v):
            d = copy.deepcopy(doc)
            if not path:
                return v
            cur = d
            for p in path[:-1]:
                cur = cur[p]
            cur[path[-1]] = v
            return d

        def drop():
            d = copy.deepcopy(doc)
            cur = d
            for p in path[:-1]:
                cur = cur[p]
            del cur[path[-1]]
            return d

        if path:
            for v in others:
                out.append(put(v))
            if isinstance(path[-1], str):
                out.append(drop())
        if isinstance(node, dict):
            for k, v in node.items():
                visit(path + [k], v)
            out.append(put({**node, "extra_key": 1}) if path else {**node, "extra_key": 1})
        elif isinstance(node, list):
            for i, v in enumerate(node):
                visit(path + [i], v)
            if node:
                out.append(put(node + [node[0]]))
            out.append(put([]))
        elif isinstance(node, str):
            out.append(put(node * 5))

    visit([], doc)
    return out


def has_extra_keys(doc, declared):
    """Whether `doc` has a key that no schema here declares (beside dictionary keys)."""
    if isinstance(doc, dict):
        return any((k not in declared and k != "Ann") or has_extra_keys(v, declared) for k, v in doc.items())
    if isinstance(doc, list):
        return any(has_extra_keys(v, declared) for v in doc)
    return False


def is_canonical_number(doc):
    if isinstance(doc, float) and doc.is_integer():
        return False
    if isinstance(doc, dict):
        return all(is_canonical_number(v) for v in doc.values())
    if isinstance(doc, list):
        return all(is_canonical_number(v) for v in doc)
    return True


def main() -> None:
    work = Work(title="Dune", kind=Kind.book, year=1965, rating=4.5, tags=["sf", "desert"],
                authors=[Person(name="Frank", born=1920)], done=True, medium="paper", note=None)
    tree = Tree(label="a", children=[Tree(label="b", children=[Tree(label="c")]), Tree(label="d")])
    scores = Scores(by_name={"Ann": 3}, pair=[0.5, -1.25])
    declared = {"title", "kind", "year", "rating", "tags", "authors", "name", "born", "done", "medium", "note",
                "label", "children", "by_name", "pair"}
    cases = []
    for name, model, instance in [("work", Work, work), ("tree", Tree, tree), ("scores", Scores, scores)]:
        for flavour, schema in [("pydantic", model.model_json_schema()), ("openai-strict", to_strict_json_schema(model))]:
            doc = json.loads(instance.model_dump_json())
            candidates = [doc] + mutations(doc)
            docs, seen = [], set()
            for d in candidates:
                text = json.dumps(d, separators=(",", ":"), ensure_ascii=False)
                if text in seen or not is_canonical_number(d) or has_extra_keys(d, declared) and "extra_key" not in text:
                    continue
                seen.add(text)
                valid = jsonschema.Draft202012Validator(schema).is_valid(d)
                docs.append({"text": text, "valid": valid})
            cases.append({"name": f"{name}/{flavour}", "schema": schema, "docs": docs})
    json.dump(cases, open("fixtures/json-schema/cases.json", "w"), indent=1, ensure_ascii=False)
    n = sum(len(c["docs"]) for c in cases)
    v = sum(d["valid"] for c in cases for d in c["docs"])
    print(f"wrote {len(cases)} schemas, {n} documents ({v} valid) to fixtures/json-schema/cases.json")


if __name__ == "__main__":
    main()
