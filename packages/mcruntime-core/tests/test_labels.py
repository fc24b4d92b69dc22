"""Label selectors: the API server's syntax, parsed and matched client-side."""

from __future__ import annotations

import pytest

from mcruntime._base.labels import LabelSelector

WEB = {"app": "web", "tier": "frontend", "env": "prod"}
DB = {"app": "db", "tier": "backend"}
BARE: dict[str, str] = {}


def selects(selector: str, labels: dict[str, str]) -> bool:
    return LabelSelector.parse(selector).matches(labels)


# -- operators ------------------------------------------------------------------------


@pytest.mark.parametrize("selector", ["app=web", "app==web"])
def test_equality_selects_objects_with_that_value(selector: str) -> None:
    assert selects(selector, WEB)
    assert not selects(selector, DB)
    assert not selects(selector, BARE)


def test_inequality_selects_other_values_and_objects_without_the_key() -> None:
    assert not selects("app!=web", WEB)
    assert selects("app!=web", DB)
    assert selects("app!=web", BARE)


def test_in_selects_any_listed_value() -> None:
    assert selects("app in (web,db)", WEB)
    assert selects("app in (web,db)", DB)
    assert not selects("app in (cache)", WEB)
    assert not selects("app in (web)", BARE)


def test_notin_selects_unlisted_values_and_objects_without_the_key() -> None:
    assert not selects("app notin (web,db)", WEB)
    assert selects("app notin (cache)", WEB)
    assert selects("app notin (web)", BARE)


def test_a_bare_key_selects_objects_that_have_it() -> None:
    assert selects("env", WEB)
    assert not selects("env", DB)


def test_a_negated_key_selects_objects_that_lack_it() -> None:
    assert not selects("!env", WEB)
    assert selects("!env", DB)
    assert selects("!env", BARE)


def test_an_empty_value_matches_only_an_empty_label() -> None:
    assert selects("canary=", {"canary": ""})
    assert not selects("canary=", {"canary": "yes"})
    assert not selects("canary=", BARE)


def test_every_requirement_must_hold() -> None:
    selector = LabelSelector.parse("app=web,tier in (frontend, edge),!debug,env")

    assert len(selector.requirements) == 4
    assert selector.matches(WEB)
    assert not selector.matches({**WEB, "debug": "true"})
    assert not selector.matches({**WEB, "tier": "backend"})
    assert not selector.matches(DB)


def test_qualified_keys_and_dotted_values_are_accepted() -> None:
    labels = {"app.kubernetes.io/name": "web", "example.com/version": "1.2.3"}

    assert selects("app.kubernetes.io/name=web,example.com/version in (1.2.3, 1.2.4)", labels)
    assert not selects("example.com/version=1.2", labels)


# -- syntax ---------------------------------------------------------------------------


def test_whitespace_around_keys_operators_values_and_commas_is_ignored() -> None:
    selector = LabelSelector.parse(
        "  app  ==  web ,  tier   in   (  frontend ,  edge  )  ,  !  debug  , env "
    )

    assert selector.matches(WEB)
    assert not selector.matches({**WEB, "debug": ""})
    assert selects(" app != db ", WEB)


def test_commas_inside_a_value_set_do_not_split_requirements() -> None:
    selector = LabelSelector.parse("app in (web,db,cache),tier notin (backend,batch)")

    assert len(selector.requirements) == 2
    assert selector.matches(WEB)
    assert not selector.matches(DB)


def test_in_without_a_space_before_the_parenthesis_is_accepted() -> None:
    assert selects("app in(web,db)", WEB)
    assert not selects("app notin(web)", WEB)


def test_a_mapping_is_a_set_of_equalities() -> None:
    selector = LabelSelector.parse({"app": "web", "tier": "frontend"})

    assert selector.matches(WEB)
    assert not selector.matches({"app": "web"})
    assert not selector.matches(DB)
    assert str(selector) == "app=web,tier=frontend"


def test_the_text_of_a_parsed_string_is_kept() -> None:
    assert str(LabelSelector.parse("app in (web, db)")) == "app in (web, db)"


@pytest.mark.parametrize("empty", [None, "", "   ", {}])
def test_an_empty_selector_matches_everything(empty: str | dict[str, str] | None) -> None:
    selector = LabelSelector.parse(empty)

    assert selector.empty
    assert selector.matches(WEB)
    assert selector.matches(BARE)
    assert selector.matches(None)


def test_a_non_empty_selector_is_not_empty() -> None:
    assert not LabelSelector.parse("app").empty


def test_matches_none_is_matching_no_labels() -> None:
    assert not LabelSelector.parse("app=web").matches(None)
    assert LabelSelector.parse("!app").matches(None)
    assert LabelSelector.parse("app notin (web)").matches(None)


@pytest.mark.parametrize(
    ("selector", "bad_part"),
    [
        ("app=web,tier=front end", "tier=front end"),
        ("app===web", "app===web"),
        ("app=web=db", "app=web=db"),
        ("app in web", "app in web"),
        ("app in (web", "app in (web"),
        ("app in (web))", "app in (web))"),
        ("app notin web,db)", "app notin web,db)"),
        ("!app=web", "!app=web"),
        ("=web", "=web"),
        ("app web", "app web"),
        ("app in ()", "app in ()"),
        ("app notin ( )", "app notin ( )"),
    ],
)
def test_invalid_syntax_raises_value_error_naming_the_bad_part(selector: str, bad_part: str) -> None:
    with pytest.raises(ValueError, match="invalid label selector") as caught:
        LabelSelector.parse(selector)

    assert repr(bad_part) in str(caught.value)


def test_parsed_selectors_compare_equal_by_their_requirements_and_text() -> None:
    assert LabelSelector.parse("app=web") == LabelSelector.parse("app=web")
    assert LabelSelector.parse("app=web") != LabelSelector.parse("app!=web")
