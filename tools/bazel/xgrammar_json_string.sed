# xgrammar 0.2.9 JSONSchemaConverter::GenerateString: a string with minLength
# or maxLength repeats a character class that lets raw control characters
# U+0000-U+001F (but CR and LF) through, which JSON forbids unescaped, so a
# bounded string could come out as invalid JSON (upstream issue 800, open).
# The class gets them excluded, like the unbounded string's. Escapes stay
# unreachable inside bounded strings: the output is narrower, never invalid.
s/AddCharacterClass({{'"', '"'}, {'\\\\', '\\\\'}, {'\\r', '\\r'}, {'\\n', '\\n'}}, true)/AddCharacterClass({{0, 0x1f}, {'"', '"'}, {'\\\\', '\\\\'}}, true)/
