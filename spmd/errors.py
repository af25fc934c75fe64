"""The exception types users see.

Every user mistake raises a subclass of :class:`SpmdError`.  Each subclass also
derives from the matching built-in exception (``TypeError``, ``ValueError``,
``IndexError``) so that code written for numpy or JAX keeps catching it.
Messages name the function, the argument (its pytree path where there is one),
the offending value and the fix.
"""

from __future__ import annotations


class SpmdError(Exception):
    """Base class of every error that ``spmd`` raises for a user mistake."""


class ConcretizationError(SpmdError, TypeError):
    """A traced (abstract) value was used where a concrete Python value is needed.

    Raised by ``bool()``, ``int()``, ``float()``, ``if``/``while`` on a traced
    value, and by functions that need a static value (a shape, an axis).
    """


class TracerBoolConversionError(ConcretizationError):
    """``bool()`` (an ``if``/``while``/``and``/``or``) on a traced value."""


class TracerIntegerConversionError(ConcretizationError):
    """``int()``/``float()``/``__index__`` on a traced value."""


class ShapeError(SpmdError, ValueError):
    """Operand shapes that do not fit together (binary ops, dot, reshape, ...)."""


class DTypeError(SpmdError, TypeError):
    """An unsupported dtype, or operand dtypes an operation does not accept."""


class IndexOutOfBoundsError(SpmdError, IndexError):
    """A static index outside an array's bounds."""


class StaticArgumentError(SpmdError, ValueError):
    """A bad ``static_argnums``/``static_argnames`` entry or an unhashable static value."""


class OutputTypeError(SpmdError, TypeError):
    """A transformed function returned something that is not an array leaf."""


class DeviceError(SpmdError, ValueError):
    """A bad device configuration (count, platform) or a mesh needing more devices."""


class ArgumentError(SpmdError, ValueError):
    """An argument of an spmd function has a bad value (axis out of range, ...)."""


class ProgramTypeError(SpmdError, TypeError):
    """A program failed the type checker (an internal or user-built program is ill-typed)."""


class DeletedArrayError(SpmdError, RuntimeError):
    """An :class:`spmd.Array` was used after it was donated to a jitted call."""


class NotFullyAddressableError(SpmdError, ValueError):
    """The value of an :class:`spmd.Array` spread over several processes was needed
    where this process holds only some of its blocks (``np.asarray``, an eager
    operation); gather it with ``spmd.process_allgather`` first."""


class SpreadOverProcessesError(SpmdError, ValueError):
    """An equation that runs only as part of a program partitioned over processes (a
    ``shard_map`` over a mesh spread over processes) cannot run where it is: in a
    loop, ``cond``, ``checkpoint`` or custom derivative whose program cannot be
    partitioned over its mesh, or in a program compiled for this process alone."""


class ProgramMismatchError(SpmdError, RuntimeError):
    """Processes of one mesh are about to run different programs, or (with
    ``SPMD_CHECK_COLLECTIVES=1``) issue different collectives at the same point."""


class ShardingTypeError(SpmdError, TypeError):
    """On explicit mesh axes (shardings in types): an operation's result sharding is
    ambiguous, or its operands' shardings disagree (JAX's ``ShardingTypeError``); the
    message names the fix (``reshard``, ``out_sharding=``, ``auto_axes``)."""


class MissingExplicitRuleError(ShardingTypeError, NotImplementedError):
    """A primitive without an explicit-sharding rule met a typed (explicitly sharded)
    operand."""
