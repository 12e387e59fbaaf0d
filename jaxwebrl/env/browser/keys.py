"""Key names -> CDP `Input.dispatchKeyEvent` parameters, so `key` actions such as ["ctrl", "a"] or ["Enter"]
become the same key events a person's keyboard would send.
"""

from __future__ import annotations

from typing import Sequence

_NAMED_KEYS = {
    "enter": ("Enter", "Enter", 13, "\r"),
    "return": ("Enter", "Enter", 13, "\r"),
    "tab": ("Tab", "Tab", 9, ""),
    "backspace": ("Backspace", "Backspace", 8, ""),
    "delete": ("Delete", "Delete", 46, ""),
    "escape": ("Escape", "Escape", 27, ""),
    "esc": ("Escape", "Escape", 27, ""),
    "space": (" ", "Space", 32, " "),
    "arrowleft": ("ArrowLeft", "ArrowLeft", 37, ""),
    "arrowup": ("ArrowUp", "ArrowUp", 38, ""),
    "arrowright": ("ArrowRight", "ArrowRight", 39, ""),
    "arrowdown": ("ArrowDown", "ArrowDown", 40, ""),
    "left": ("ArrowLeft", "ArrowLeft", 37, ""),
    "up": ("ArrowUp", "ArrowUp", 38, ""),
    "right": ("ArrowRight", "ArrowRight", 39, ""),
    "down": ("ArrowDown", "ArrowDown", 40, ""),
    "home": ("Home", "Home", 36, ""),
    "end": ("End", "End", 35, ""),
    "pageup": ("PageUp", "PageUp", 33, ""),
    "pagedown": ("PageDown", "PageDown", 34, ""),
}
_MODIFIERS = {"alt": 1, "ctrl": 2, "control": 2, "meta": 4, "cmd": 4, "command": 4, "super": 4, "shift": 8}
_MODIFIER_KEYS = {1: ("Alt", "AltLeft", 18), 2: ("Control", "ControlLeft", 17), 4: ("Meta", "MetaLeft", 91),
                  8: ("Shift", "ShiftLeft", 16)}


def _key_event(name: str) -> tuple[str, str, int, str] | None:
    named = _NAMED_KEYS.get(name.lower())
    if named:
        return named
    if len(name) == 1:
        ch = name
        if ch.isascii() and ch.isalpha():   # a US-keyboard key; other letters ("ß", "é") only type themselves
            return ch, f"Key{ch.upper()}", ord(ch.upper()), ch
        if ch.isascii() and ch.isdigit():
            return ch, f"Digit{ch}", ord(ch), ch
        return ch, "", 0, ch
    if name.lower().startswith("f") and name[1:].isdigit() and 1 <= int(name[1:]) <= 12:
        return name.upper(), name.upper(), 111 + int(name[1:]), ""
    return None


def key_events(keys: Sequence[str]) -> list[dict]:
    """CDP Input.dispatchKeyEvent params that press `keys` together: modifiers down, each key down/up, modifiers
    up in reverse. ValueError names an unknown key."""
    modifiers, mains = 0, []
    for name in keys:
        bit = _MODIFIERS.get(name.lower())
        if bit:
            modifiers |= bit
        else:
            event = _key_event(name)
            if event is None:
                raise ValueError(f"unknown key {name!r}: use names like Enter, Tab, Escape, ArrowDown, a, F5")
            mains.append(event)
    held = [bit for bit in _MODIFIER_KEYS if modifiers & bit]
    events, pressed = [], 0
    for bit in held:
        pressed |= bit
        key, code, vk = _MODIFIER_KEYS[bit]
        events.append({"type": "rawKeyDown", "key": key, "code": code, "windowsVirtualKeyCode": vk,
                       "modifiers": pressed})
    for key, code, vk, text in mains:
        down = {"key": key, "code": code, "windowsVirtualKeyCode": vk, "modifiers": modifiers}
        typed = text if not (modifiers & (1 | 2 | 4)) else ""  # alt/ctrl/meta chords type nothing
        if typed and modifiers & 8 and len(typed) == 1:
            typed = typed.upper()
        events.append({"type": "keyDown" if typed else "rawKeyDown", "text": typed, "unmodifiedText": typed, **down})
        events.append({"type": "keyUp", **down})
    for bit in reversed(held):
        pressed &= ~bit
        key, code, vk = _MODIFIER_KEYS[bit]
        events.append({"type": "keyUp", "key": key, "code": code, "windowsVirtualKeyCode": vk, "modifiers": pressed})
    return events
