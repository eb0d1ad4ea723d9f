"""Inputs a component also takes as Outputs (another resource's, a StackReference's): judged by the stack models as
plain ones are, once their values are known."""

# No `from __future__ import annotations`: the components beside it are read by Pulumi's analyzer.
import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import pulumi

from stack_config.errors import ConfigError, InvalidInputError, Loc, validated

T = TypeVar("T")
U = TypeVar("U")


def is_plain(value: object) -> bool:
    """No Output or awaitable anywhere in it: known now, in a preview too."""
    if isinstance(value, pulumi.Output) or inspect.isawaitable(value):
        return False
    if isinstance(value, dict):
        return all(is_plain(item) for item in value.values())
    return all(is_plain(item) for item in value) if isinstance(value, list | tuple) else True


def derive(value: T | pulumi.Output[T], make: Callable[[T], U]) -> pulumi.Input[U]:
    """What `make` writes for the value: plain for a plain one, so a plain program declares what it always did; else
    an Output, unknown in a preview that does not know the value (never a default in its place)."""
    return value.apply(make) if isinstance(value, pulumi.Output) else make(value)


def validated_input(
    kind: Any,
    value: Any,
    loc: Loc,
    component: str,
    check: Callable[[Any], Iterable[ConfigError]] = lambda _: (),
) -> Any:
    """`value` validated as `kind`, then by `check`: at once where it is plain (an InvalidInputError, as for any input),
    else once its Outputs are known, as an Output. Raised in an apply, a RunError is what `up` and `preview` report as
    its message alone, naming the component and the input, as the program reports an invalid stack file."""

    def judged(known: Any) -> Any:
        result = validated(kind, known, loc)
        problems = list(check(result))
        if problems:
            raise InvalidInputError.of(problems)
        return result

    if is_plain(value):
        return judged(value)

    def when_known(known: Any) -> Any:
        try:
            return judged(known)
        except InvalidInputError as error:
            raise pulumi.RunError(f"invalid inputs of {component}: {error}") from None

    return pulumi.Output.from_input(value).apply(when_known)


def as_args(value: pulumi.Input[Any]) -> Any:
    """A desired/ object (or an Output of one) where the SDK's typed arguments are expected. Its keys are the API's
    own field names, which the SDK sends unchanged where they are not its Python names (pulumi 3.272.0
    runtime/rpc.py:739-743, read); a key the API does not know fails every render's strict schema check
    (tests/test_schemas.py)."""
    return value
