# Where this machine's apt gets Debian from, for debootstrap (sourced by
# deploy/docker-setup.sh and tests/deploy/apt_source_test.sh).
#
# apt_source SUITE [ETC]: prints "URI SUITE" for the first enabled binary
# ("deb") source in ETC/sources.list, ETC/sources.list.d/*.list (one-line
# format) and ETC/sources.list.d/*.sources (deb822) that carries SUITE and the
# component main over a scheme debootstrap fetches from (http, https, ftp,
# file). ETC defaults to /etc/apt. Prints nothing and returns 1, listing on
# stderr the files read and what they offered, when none does.
#
# apt_proxy [SCHEME]: apt's proxy for SCHEME (http unless given), as
# apt-config reports it (APT_CONFIG points it at another file); empty when
# none is set or it is DIRECT.

apt_source() {
  local suite=$1 etc=${2:-/etc/apt}
  local files=() f
  [ -f "$etc/sources.list" ] && files+=("$etc/sources.list")
  for f in "$etc"/sources.list.d/*.list "$etc"/sources.list.d/*.sources; do
    [ -f "$f" ] && files+=("$f")
  done
  if [ ${#files[@]} -eq 0 ]; then
    echo "apt-source: no sources.list, sources.list.d/*.list or *.sources under $etc" >&2
    return 1
  fi
  local found
  found=$(awk -v want="$suite" -v read="${files[*]}" -f - "${files[@]}" <<'AWK'
    function usable(uri) { return uri ~ /^(https?|ftp|file):/ }
    function has(list, word,    n, i, parts) {
      n = split(list, parts, /[ \t]+/)
      for (i = 1; i <= n; ++i) if (parts[i] == word) return 1
      return 0
    }
    # One deb822 stanza, its fields gathered in f[] (names lower-cased).
    function stanza(    n, i, uris, suites) {
      if (!("uris" in f)) { delete f; return }
      offered[++offers] = FILENAME ": " f["types"] " " f["uris"] " " f["suites"] " " f["components"]
      if (!result && tolower(f["enabled"]) != "no" && has(f["types"], "deb") && has(f["suites"], want) &&
          has(f["components"], "main")) {
        n = split(f["uris"], uris, /[ \t]+/)
        for (i = 1; i <= n; ++i) if (usable(uris[i])) { result = uris[i] " " want; break }
      }
      delete f
    }
    FNR == 1 { if (field != "") stanza(); field = "" }
    FILENAME ~ /\.sources$/ {
      if ($0 ~ /^[ \t]*#/) next
      if ($0 ~ /^[ \t]*$/) { stanza(); field = ""; next }
      if ($0 ~ /^[ \t]/) { if (field != "") f[field] = f[field] " " $0; next }
      field = tolower(substr($0, 1, index($0, ":") - 1))
      f[field] = substr($0, index($0, ":") + 1)
      gsub(/^[ \t]+|[ \t]+$/, "", f[field])
      next
    }
    {  # one-line format: deb [options] uri suite component...
      line = $0
      sub(/#.*/, "", line)
      if (line ~ /^[ \t]*$/) next
      sub(/\[[^]]*\]/, "", line)
      n = split(line, w, /[ \t]+/)
      start = (w[1] == "") ? 2 : 1
      offered[++offers] = FILENAME ": " line
      if (result || w[start] != "deb" || w[start + 2] != want || !usable(w[start + 1])) next
      for (i = start + 3; i <= n; ++i) if (w[i] == "main") { result = w[start + 1] " " want; break }
    }
    END {
      if (field != "") stanza()
      if (result) { print result; exit 0 }
      print "apt-source: no enabled \"deb\" source for suite " want " with component main over http, https, ftp" \
            " or file in " read "; they offer:" > "/dev/stderr"
      for (i = 1; i <= offers; ++i) print "  " offered[i] > "/dev/stderr"
      exit 1
    }
AWK
  ) || return 1
  echo "$found"
}

apt_proxy() {
  local scheme=${1:-http} proxy=""
  command -v apt-config > /dev/null || return 0
  eval "$(apt-config shell proxy "Acquire::$scheme::Proxy")"
  [ "$proxy" = "DIRECT" ] && proxy=""
  echo "$proxy"
}
