"""`cardc docs`: a static, cross-linked site of a card library (see cardc.docs.site)."""
