// Lower-case hex of bytes and its strict inverse: the job secret's text form, and digests in tests.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace deepen::control {

std::string to_hex(std::span<const uint8_t> bytes);

// Either case; nullopt on an odd length or a non-hex character.
std::optional<std::vector<uint8_t>> from_hex(std::string_view text);

}  // namespace deepen::control
