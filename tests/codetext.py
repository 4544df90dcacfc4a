"""Generated text as tests read it: each statement on one line, as the printer writes it
before cardc.linebreak breaks the lines over 120 characters at brackets, commas and operators."""

import re


def unbroken(src: str) -> str:
    """`src` with the lines cardc.linebreak broke joined back."""
    src = re.sub(r"([(\[{])\n\s+", r"\1", src)
    src = re.sub(r",?\n\s+([)\]}])", r"\1", src)
    src = re.sub(r",\n\s+", ", ", src)
    return re.sub(r"\n\s+(?=(?:if|else|for|and|or|[-+*/@&|<>=!]+) )", " ", src)
