"""How a number is written in the text pe_fast reads, a flag's or a table's cell: what Python's int() and float()
take and no other program reads as that number is refused."""


def check_ascii_number(text):
    """A number's text is ASCII without underscores: Python's int() and float() read any Unicode digit (--steps ２, a
    full-width 2), which a command line shows as something other than the number it is, and underscores between
    digits (1_000), which no other program reads as a number. ValueError naming the text otherwise."""
    if isinstance(text, str) and not text.isascii():
        raise ValueError(f"{text!r}: a number is written in ASCII digits only")
    if isinstance(text, str) and "_" in text:  # int("1_000") is 1000, float("1_0.5") 10.5: Python's, not a number's
        raise ValueError(f"{text!r}: a number is written without underscores")
