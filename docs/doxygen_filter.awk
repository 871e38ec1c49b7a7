# Doxygen input filter (docs/Doxyfile.in): reads a header commented with plain // comments and
# writes it with Doxygen comments, line for line (line numbers stay right):
#   - the comment block the file opens with:        /// \file + the text (the file's description)
#   - a comment on its own line:                    /// text (documents the declaration below)
#   - a comment after a member, enumerator or parameter ending in ; or ,:  ///< text
# In the comment text, the characters Doxygen would read as commands or HTML are escaped.

# The comment text with \ @ < > & # % $ escaped, so that "<label byte>" or "a \n b" stay prose;
# in `code` spans also ::, so that Doxygen does not try to link a name it cannot resolve (an enum
# class's value, `Algorithm::ring`).
function escape(text, out, span) {
  gsub(/\\/, "\\\\", text)
  gsub(/[@<>&#%$]/, "\\\\&", text)
  out = ""
  while (match(text, /`[^`]*`/)) {
    span = substr(text, RSTART, RLENGTH)
    gsub(/::/, "\\\\::", span)
    out = out substr(text, 1, RSTART - 1) span
    text = substr(text, RSTART + RLENGTH)
  }
  return out text
}

# True when `code` (a line's text before //) leaves a string literal open: the // is inside it.
function in_string(code, stripped) {
  stripped = code
  gsub(/\\./, "", stripped)  # escaped characters, \" included
  return gsub(/"/, "", stripped) % 2 == 1
}

BEGIN { opening = 1 }

{
  line = $0
  # The opening block: // lines from the first line on.
  if (opening && match(line, /^\/\/ ?/)) {
    if (NR == 1) printf "/// \\file\n"
    print "/// " escape(substr(line, RLENGTH + 1))
    next
  }
  opening = 0
  # A comment on its own line.
  if (match(line, /^[ \t]*\/\/ ?/) && line !~ /^[ \t]*\/\/\//) {
    indent = line
    sub(/\/\/.*/, "", indent)
    print indent "/// " escape(substr(line, RLENGTH + 1))
    next
  }
  # A comment after a declaration that ends in ; or , (a member, an enumerator, a parameter).
  if (match(line, /[;,][ \t]+\/\/ /) && !in_string(substr(line, 1, RSTART))) {
    code = substr(line, 1, RSTART + RLENGTH - 4)
    print code "///< " escape(substr(line, RSTART + RLENGTH))
    next
  }
  print line
}
