// Per-job secret: 32 random bytes that every rank of one job shares, from env or a mode-0600 file.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace deepen::control {

using Secret = std::array<uint8_t, 32>;

// 32 bytes from OpenSSL's CSPRNG (RAND_bytes); throws std::runtime_error if it fails.
Secret generate_secret();

// 64 lower-case hex characters.
std::string secret_hex(const Secret& secret);

// Parses 64 hex characters (surrounding whitespace allowed, as a file written by `xxd -p -c 64`
// has a newline). Throws InputError naming `origin` (the file or variable) and the reason.
Secret parse_secret_hex(std::string_view text, const std::string& origin);

// Writes the secret as hex to `path` with mode 0600 (created under a temporary name with that mode,
// then renamed, so it is never readable by others, not even briefly). Throws InputError naming the
// path on failure.
void write_secret_file(const std::string& path, const Secret& secret);

// Reads a file written by write_secret_file (or by slurm/lib.sh). Refuses, with an InputError naming
// the path, a file that group or others may read: a leaked secret lets anyone on the cluster
// network abort the job.
Secret read_secret_file(const std::string& path);

// DEEPEN_JOB_SECRET (hex) if set, else the file named by DEEPEN_JOB_SECRET_FILE if set, else
// nullopt (the caller makes one and shares it, e.g. rank 0 generates and broadcasts over MPI).
std::optional<Secret> secret_from_env();

}  // namespace deepen::control
