set -euo pipefail
umask 022
export LC_ALL=C DEBIAN_FRONTEND=noninteractive GOTOOLCHAIN=local
PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
TETHER_FAMILY=debian
TETHER_ARCH=amd64
TETHER_MIRROR=http://10.0.0.1:8080/mirror
TETHER_STATE=/var/lib/tether/components
TETHER_BUILD=/var/cache/tether/build
export TETHER_STATE TETHER_BUILD
: "${TETHER_PROVENANCE:=/dev/null}"
if [[ -z ${TETHER_WORKDIR:-} ]]; then
  TETHER_WORKDIR=$(mktemp -d)
  trap 'rm -rf "$TETHER_WORKDIR"' EXIT
fi

# -- logging and reporting (no tracing: step environments can hold secrets) ----------------
log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() {
  printf '[%s] ERROR: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2
  exit 1
}
provenance() { printf '%s=%s\n' "$1" "$2" >>"$TETHER_PROVENANCE"; }

retry() { # retry ATTEMPTS COMMAND...: exponential backoff from 2s, capped at 30s
  local attempts=$1 delay=2 n=1
  shift
  until "$@"; do
    if ((n >= attempts)); then
      log "giving up after $n attempts: $*"
      return 1
    fi
    log "attempt $n of $attempts failed: $*; retrying in ${delay}s"
    sleep "$delay"
    n=$((n + 1))
    delay=$((delay * 2 > 30 ? 30 : delay * 2))
  done
}

check_os() { # the plan was rendered for one OS family; refuse to run on another
  local id="" like="" word family=unknown
  if [[ -r /etc/os-release ]]; then
    id=$(. /etc/os-release && printf '%s' "${ID:-}")
    like=$(. /etc/os-release && printf '%s' "${ID_LIKE:-}")
  fi
  for word in $id $like; do
    case $word in
      debian | ubuntu) family=debian ;;
      rhel | rocky | centos | fedora | almalinux) family=rhel ;;
      amzn) family=amazon ;;
      *) continue ;;
    esac
    break
  done
  [[ $family == "$TETHER_FAMILY" ]] || die "this step was rendered for $TETHER_FAMILY, but the node is $family"
}

install_file() { # install_file DEST MODE < CONTENT: write only when different; return 0 if changed
  local dest=$1 mode=$2 tmp
  mkdir -p "$(dirname "$dest")"
  tmp=$(mktemp "$dest.tether.XXXXXX")
  cat >"$tmp"
  chmod "$mode" "$tmp"
  if [[ -f $dest ]] && cmp -s "$tmp" "$dest"; then
    rm -f "$tmp"
    return 1
  fi
  mv -f "$tmp" "$dest"
  log "wrote $dest"
}

state_get() { # state_get COMPONENT KEY: what tether recorded after its last install
  local file="$TETHER_STATE/$1"
  [[ -f $file ]] || return 0
  awk -F= -v k="$2" '$1 == k { print substr($0, length(k) + 2); exit }' "$file"
}

state_set() { # state_set COMPONENT KEY=VALUE...
  mkdir -p "$TETHER_STATE"
  printf '%s\n' "${@:2}" | install_file "$TETHER_STATE/$1" 0644 || true
}

version_matches() { # version_matches INSTALLED WANT: WANT is a prefix ending at a boundary
  local v=${1#v} want=${2#v}
  [[ $v == *:* ]] && v=${v#*:}
  [[ $v == "$want" || $v == "$want"[-~+.]* ]]
}

# -- downloads: every URL goes through the mirror, every file is checked --------------------
mirror_url() { # https://HOST/PATH becomes MIRROR/HOST/PATH when a download mirror is set
  if [[ -n $TETHER_MIRROR && $1 == https://* ]]; then
    printf '%s/%s\n' "$TETHER_MIRROR" "${1#https://}"
  else
    printf '%s\n' "$1"
  fi
}

fetch() { # fetch URL DEST
  retry 5 curl -fsSL --proto '=https,http' --connect-timeout 20 --retry 2 -o "$2" "$(mirror_url "$1")"
}

verify_sha256() { # verify_sha256 FILE HEX
  local got
  got=$(sha256sum "$1" | cut -d' ' -f1)
  [[ $got == "$2" ]] || die "checksum mismatch for $1: expected $2, got $got"
}

fetch_verified() { # fetch_verified URL DEST CHECK: CHECK is a sha256, published:URL or unpublished
  local url=$1 dest=$2 check=$3 sum
  case $check in
    published:*)
      fetch "${check#published:}" "$dest.sha256"
      sum=$(awk -v f="${url##*/}" 'NF == 1 { print $1; exit } $2 == f || $2 == "*" f { print $1; exit }' "$dest.sha256")
      [[ $sum =~ ^[0-9a-f]{64}$ ]] || die "no checksum for ${url##*/} in ${check#published:}"
      ;;
    unpublished)
      fetch "$url" "$dest"
      log "upstream publishes no checksum for ${url##*/}; recording what was fetched"
      provenance "download.${url##*/}.sha256" "$(sha256sum "$dest" | cut -d' ' -f1)"
      return 0
      ;;
    *) sum=$check ;;
  esac
  fetch "$url" "$dest"
  verify_sha256 "$dest" "$sum"
}

key_fingerprints() { # key_fingerprints FILE: the primary key fingerprints of a PGP key file
  gpg --batch --show-keys --with-colons "$1" 2>/dev/null | awk -F: '$1 == "pub" { p = 1; next } $1 == "fpr" && p { print $10; p = 0 }'
}

fetch_key() { # fetch_key URL DEST [FINGERPRINT]: a repository signing key, pinned when known
  local tmp="$TETHER_WORKDIR/key.asc"
  fetch "$1" "$tmp"
  if [[ -n ${3:-} ]]; then
    key_fingerprints "$tmp" | grep -qx "$3" || die "signing key at $1 is not $3"
  fi
  install_file "$2" 0644 <"$tmp" || true
}

# -- packages (apt) ------------------------------------------------------------------------
APT_OPTS=(-y -q -o DPkg::Lock::Timeout=600 -o Dpkg::Options::=--force-confold --no-install-recommends)
pkg_refresh() { retry 5 apt-get -q -o DPkg::Lock::Timeout=600 update; }
pkg_install() { retry 3 apt-get install "${APT_OPTS[@]}" "$@"; }
pkg_version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || true; }
pkg_available() { apt-cache madison "$1" | awk '{ print $3 }'; }
pkg_candidate() { # newest available version of NAME that matches WANT
  local v
  while read -r v; do
    if version_matches "$v" "$2"; then
      printf '%s\n' "$v"
      return 0
    fi
  done < <(pkg_available "$1")
}
pkg_install_pinned() { # pkg_install_pinned WANT NAME...: exactly that version, or fail loudly
  local want=$1 name candidate specs=()
  shift
  for name in "$@"; do
    candidate=$(pkg_candidate "$name" "$want")
    [[ -n $candidate ]] || die "$name $want is not available (available: $(pkg_available "$name" | head -5 | xargs))"
    specs+=("$name=$candidate")
  done
  pkg_install --allow-downgrades --allow-change-held-packages "${specs[@]}"
}
add_repo() { # add_repo NAME KEYFILE LINE: an apt source signed by KEYFILE
  printf 'deb [signed-by=%s] %s\n' "$2" "$3" | install_file "/etc/apt/sources.list.d/$1.list" 0644 || true
}

# -- builds from git: fetch the resolved commit, never a moving ref --------------------------
git_resolve() { # git_resolve REPO REF: the commit REF names now
  local out sha
  if [[ $2 =~ ^[0-9a-f]{40}$ ]]; then
    printf '%s\n' "$2"
    return 0
  fi
  out=$(retry 3 git ls-remote "$1" "$2" "$2^{}") || die "cannot reach $1"
  sha=$(awk '$2 ~ /\^\{\}$/ { print $1; exit }' <<<"$out")
  [[ -n $sha ]] || sha=$(awk 'NR == 1 { print $1 }' <<<"$out")
  [[ $sha =~ ^[0-9a-f]{40}$ ]] || die "$2 does not name anything in $1"
  printf '%s\n' "$sha"
}

git_checkout() { # git_checkout REPO REF COMMIT DIR
  local repo=$1 ref=$2 sha=$3 dir=$4
  rm -rf "$dir"
  mkdir -p "$dir"
  git -C "$dir" init -q
  git -C "$dir" remote add origin "$repo"
  if ! retry 2 git -C "$dir" fetch -q --depth 1 origin "$sha"; then
    retry 3 git -C "$dir" fetch -q --depth 1 origin "$ref"
  fi
  git -C "$dir" checkout -q FETCH_HEAD
  [[ $(git -C "$dir" rev-parse HEAD) == "$sha" ]] || die "$ref moved while it was fetched; run the step again"
}

install_go() { # install_go SRC: the Go toolchain the source asks for, checksum-verified
  local want="" file url tgz="$TETHER_WORKDIR/go.tgz"
  for file in go.mod vendor.mod; do
    [[ -f $1/$file ]] || continue
    want=$(awk '$1 == "toolchain" { sub(/^go/, "", $2); print $2; exit }' "$1/$file")
    [[ -n $want ]] || want=$(awk '$1 == "go" { print $2; exit }' "$1/$file")
    [[ -n $want ]] && break
  done
  [[ $want =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?$ ]] || die "cannot tell which Go version $1 needs"
  [[ $want =~ ^1\.(2[1-9]|[3-9][0-9])$ ]] && want="$want.0"
  if [[ -x /usr/local/go/bin/go && $(/usr/local/go/bin/go env GOVERSION) == "go$want" ]]; then
    return 0
  fi
  url="https://dl.google.com/go/go$want.linux-$TETHER_ARCH.tar.gz"
  fetch_verified "$url" "$tgz" "published:$url.sha256"
  rm -rf /usr/local/go
  tar -C /usr/local -xzf "$tgz"
  log "installed Go $want"
}

wait_for() { # wait_for SECONDS COMMAND...: poll every 2s
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 2
  done
}

check_os
