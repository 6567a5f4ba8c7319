"""JSON for host code through the C accelerator that the json package itself drives (_json):
`import json` also imports re and enum, a cost of every agent's start. The same values and text
as json.loads and json.dumps; json itself where _json is missing, and for the error of a malformed document (a ValueError either way)."""
try:
    import _json
except ImportError:  # an interpreter without the accelerator: the package's pure Python
    _json = None

_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _Decoding:
    """What _json.make_scanner reads off its context: json.JSONDecoder's defaults."""
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


_SPACE = " \t\n\r"
_scanners = []


def loads(text):
    if _json is None:
        import json
        return json.loads(text)
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8")
    if not _scanners:
        _scanners.append(_json.make_scanner(_Decoding))
    start = len(text) - len(text.lstrip(_SPACE))
    try:
        value, end = _scanners[0](text, start)
    except StopIteration:
        end = None
    if end is None or text[end:].strip(_SPACE):
        import json
        return json.loads(text)  # raises json's own error, with its position
    return value


def load(handle):
    return loads(handle.read())


def load_file(path):
    """The document in PATH, or None where it is missing, unreadable or malformed."""
    try:
        with open(path) as handle:
            return load(handle)
    except (OSError, ValueError):
        return None


def _unknown(value):
    raise TypeError("Object of type %s is not JSON serializable" % type(value).__name__)


def dumps(value, sort_keys=False, separators=None):
    """json.dumps(VALUE, sort_keys=..., separators=...) with its other defaults."""
    item_separator, key_separator = separators or (", ", ": ")
    if _json is None:
        import json
        return json.dumps(value, sort_keys=sort_keys, separators=(item_separator, key_separator))
    encode = _json.make_encoder({}, _unknown, _json.encode_basestring_ascii, None,
                                key_separator, item_separator, sort_keys, False, True)
    return "".join(encode(value, 0))
