# tests/gpu/tree_id.sh - sourced by run.sh and prebuild.sh, from the repository root: what names the
# tree whose engine they build or run.
# engine_sources: the engine sources as this tree has them, independent of .git (a copied
# checkout's .git was seen pointing at an older commit than its working tree): the blob ids of
# native/src's files with their paths, hashed. For a commit C the same id is
#   git ls-tree -r C native/src | awk '{print $3"  "$4}' | sha1sum | cut -c1-12
engine_sources() {
  find native/src -type f | LC_ALL=C sort | while read -r f; do echo "$(git hash-object "$f")  $f"; done \
    | sha1sum | cut -c1-12
}
# tree_commit SOURCES: HEAD, marked "+uncommitted" with the engine sources' id when tracked files
# differ from it (local edits, or a copy whose .git did not follow the working tree).
tree_commit() {
  local c; c=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  [ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || c="$c+uncommitted (engine sources $1)"
  echo "$c"
}
