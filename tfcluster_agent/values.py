"""Classes of values declared as with `dataclasses` (annotated fields, defaults, `field(...)`),
standard library only, for the agent's messages and the controller's records alike.

Hand-made rather than dataclasses: importing `dataclasses` (it imports inspect, ast, dis...) and
generating each class's methods with exec() cost every agent's start and every command of the
controller more CPU than all else they import (a third of a launch's). The subset here is
what tfcluster uses: value_class(frozen=...), field(default, default_factory, repr, compare,
metadata), fields(), replace() and as_dict().
"""
_MISSING = object()


class Field:
    """One field of a value class, as dataclasses.Field: NAME, its default (or DEFAULT_FACTORY,
    called for each new value), whether repr() and == use it, and free METADATA."""

    def __init__(self, default=_MISSING, default_factory=None, repr=True, compare=True,
                 metadata=None):
        self.name = None
        self.default, self.default_factory = default, default_factory
        self.repr, self.compare, self.metadata = repr, compare, metadata or {}

    def initial(self, owner):
        if self.default_factory is not None:
            return self.default_factory()
        if self.default is _MISSING:
            raise TypeError("%s: missing field %r" % (owner, self.name))
        return self.default


def field(**kwargs):
    """A field's settings, as dataclasses.field: default, default_factory, repr, compare,
    metadata."""
    return Field(**kwargs)


def value_class(cls=None, *, frozen=False):
    """CLS with __init__ (its fields in order, by position or name), ==, repr() and, FROZEN,
    no assignment after __init__ and a hash of the compared fields."""
    if cls is None:
        return lambda cls: value_class(cls, frozen=frozen)
    specs = []
    for name in cls.__dict__.get("__annotations__", {}):
        given = cls.__dict__.get(name, _MISSING)
        spec = given if isinstance(given, Field) else Field(default=given)
        spec.name = name
        if given is not _MISSING:
            delattr(cls, name)  # instance values only, as with a dataclass
        specs.append(spec)
    specs = tuple(specs)
    names = tuple(spec.name for spec in specs)
    compared = tuple(spec.name for spec in specs if spec.compare)
    shown = tuple(spec.name for spec in specs if spec.repr)
    assign = object.__setattr__

    def __init__(self, *args, **kwargs):
        if len(args) > len(names):
            raise TypeError("%s takes %d fields, got %d" % (cls.__name__, len(names), len(args)))
        values = dict(zip(names, args))
        for key, value in kwargs.items():
            if key not in names or key in values:
                raise TypeError("%s: unexpected or repeated field %r" % (cls.__name__, key))
            values[key] = value
        for spec in specs:
            value = values[spec.name] if spec.name in values else spec.initial(cls.__name__)
            assign(self, spec.name, value)

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in compared)

    def __repr__(self):
        return "%s(%s)" % (cls.__name__, ", ".join("%s=%r" % (n, getattr(self, n))
                                                   for n in shown))

    def refuse(self, name, *value):
        raise AttributeError("cannot assign to field %r of a frozen %s" % (name, cls.__name__))

    cls.__init__, cls.__eq__, cls.__repr__ = __init__, __eq__, __repr__
    if frozen:
        cls.__setattr__ = cls.__delattr__ = refuse
        cls.__hash__ = lambda self: hash(tuple(getattr(self, n) for n in compared))
    else:
        cls.__hash__ = None
    cls.__value_fields__ = specs
    cls.field_names = names
    return cls


def fields(value):
    """The Fields of a value class or of one of its values, in order."""
    return value.__value_fields__


def as_dict(value):
    """{field name: value} (shallow)."""
    return {name: getattr(value, name) for name in value.field_names}


def replace(value, **changes):
    """A copy of VALUE with CHANGES (field: new value)."""
    return type(value)(**dict(as_dict(value), **changes))
