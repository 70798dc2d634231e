"""The words the studio's own rules know, in one place: colours by family, the aspects of a style, how
English feedback says yes and no, and what a prompt's craft is made of.

These lists are for the studio's own reader (the offline backend's) and its checks of English text. They
never stand against a model's valid reading (`mas.agents.asking`), and a clause with a word outside them is
not understood rather than guessed at. Cue lists are set on the tuning part of the labelled sets only
(`bench/style_bench.py --part tune`).
"""

from __future__ import annotations

COLOR_FAMILIES: dict[str, tuple[str, ...]] = {
    shade: families
    for families, shades in (
        (("red",), "red crimson scarlet ruby maroon burgundy cherry vermilion carmine cardinal blood-red wine"),
        (("orange",), "orange tangerine apricot peach ochre"),
        (("orange", "red", "brown"), "rust copper"),
        (("orange", "pink"), "coral salmon"),
        (("yellow",), "yellow lemon mustard saffron canary honey"),
        (("yellow", "gold"), "gold golden gilded gilt"),
        (("yellow", "orange"), "amber"),
        (("green",), "green emerald jade olive lime mint sage moss chartreuse verdant"),
        (("cyan", "blue", "green"), "teal turquoise aqua aquamarine cyan"),
        (("blue",), "blue navy azure cobalt sapphire cerulean ultramarine denim"),
        (("blue", "purple"), "indigo"),
        (("purple",), "purple violet lavender lilac plum amethyst mauve orchid grape aubergine"),
        (("pink", "purple"), "magenta fuchsia"),
        (("pink",), "pink rose blush"),
        (("brown",), "brown chocolate bronze brass tan beige sepia umber sienna khaki"),
        (("white",), "white ivory cream pearl alabaster"),
        (("grey",), "grey gray silver slate charcoal ash gunmetal"),
        (("black",), "black ebony jet onyx obsidian"),
    )
    for shade in shades.split()
}
"""Each colour word and the families it belongs to, its own first: violet is purple, cobalt and navy are
blue, teal is cyan and between blue and green."""

DUAL_USE = frozenset(
    "coral salmon rose olive lime cherry wine honey plum peach chocolate cream pearl ash mint sage moss lemon "
    "orchid grape lavender lilac amber jet tan".split()
)
"""Colour words that are also things (a coral reef, a rose garden): a ruled-out family is not named by them
(ruling out orange does not refuse "a coral reef"); ruling out the word itself still does."""

BASIC_COLOURS = frozenset(f for families in COLOR_FAMILIES.values() for f in families)
"""The families' own names (red, blue, purple, ...): "purple" means any purple, "violet" one of them."""

ASPECT_NAMES = ("colour", "mood", "theme", "pacing", "other")
"""What a style item is about."""

MOODS = frozenset(
    "dark moody bright cheerful serene calm mysterious epic dreamy gritty whimsical melancholic melancholy "
    "energetic gloomy eerie cosy cozy romantic nostalgic tense ethereal haunting playful peaceful dramatic "
    "vibrant muted somber sombre brooding joyful warm cold cool ominous tranquil surreal uplifting "
    "cinematic moody atmospheric spooky creepy sunny colourful colorful pastel neon vivid saturated "
    "desaturated minimalist minimal intense soft harsh airy shadowy regal sleek clinical meditative intimate "
    "cheesy cute cutesy sweet scary depressing ominous earthy pastel grim bleak lush elegant upbeat happy "
    "luxurious serious".split()
)
"""Mood words the fallback reader recognises (words of light and feeling, not of subject)."""

THEMES = frozenset(
    "fantasy mythical sci-fi scifi nature urban cosmic space underwater ocean sea forest desert gothic retro "
    "cyberpunk steampunk horror noir western medieval futuristic vintage wildlife mountains city cities "
    "anime cartoon documentary historical dragons dragon creatures animals jungle arctic winter autumn "
    "summer spring beach sunset sunsets landscapes landscape water thriller mountain countryside".split()
)
"""Theme words the fallback reader recognises (a subject or a genre)."""

PACING = frozenset("slow fast lingering dynamic quick rapid leisurely frantic unhurried static choppy hectic".split())
"""Pacing words the fallback reader recognises."""

PACING_NOUNS = frozenset("pacing pace cuts cut shots shot takes take motion editing tempo rhythm".split())
"""Nouns that make a pacing word about pacing ("quick cuts", "long takes")."""

NEGATIVE_CUES = (
    "can't stand",
    "cannot stand",
    "can not stand",
    "don't like",
    "do not like",
    "don't want",
    "do not want",
    "don't love",
    "don't use",
    "dont like",
    "dont want",
    "not a fan of",
    "sick of",
    "tired of",
    "fed up with",
    "get rid of",
    "stay away from",
    "steer clear of",
    "instead of",
    "rather than",
    "other than",
    "no more",
    "not",
    "no",
    "never",
    "avoid",
    "avoiding",
    "without",
    "less",
    "fewer",
    "stop",
    "hate",
    "dislike",
    "dislikes",
    "loathe",
    "detest",
    "ban",
    "drop",
    "remove",
    "skip",
    "nothing",
    "none",
    "too",
    "overly",
    "nor",
    "zero",
    "lose",
    "ditch",
    "done with",
    "enough of",
    "enough with",
    "no thanks",
    "anything but",
    "everything but",
    "too much",
    "bored of",
    "bored with",
    "too many",
    "neither",
    "except",
    "minus",
    "isn't",
    "aren't",
    "don't",
    "doesn't",
    "dont",
    "unlike",
)
"""Words that rule out what follows them in a clause (and what precedes them when the clause had no cue
before: "red is not my thing")."""

POSITIVE_CUES = (
    "switch to",
    "go for",
    "go with",
    "more of",
    "is fine",
    "are fine",
    "is ok",
    "are ok",
    "is okay",
    "is great",
    "are great",
    "more",
    "prefer",
    "like",
    "love",
    "adore",
    "enjoy",
    "want",
    "favour",
    "favor",
    "favourite",
    "favorite",
    "use",
    "keep",
    "need",
)
"""Words that make what follows liked. Only `STRONG_POSITIVE` undoes a rule-out earlier in the same clause
("less red, more blue"); "I don't like" stays a rule-out."""

STRONG_POSITIVE = frozenset({"more", "more of", "switch to", "go for", "go with", "is fine", "are fine"})

BACKWARD_POSITIVE_CUES = frozenset(
    ("is fine", "are fine", "is ok", "are ok", "is okay", "is great", "are great", "instead of", "rather than")
)
"""Cues that also make liked the clause's words before them ("teal is fine", "blue instead of red")."""

ITEM_PHRASES: dict[str, str] = {
    phrase: aspect
    for aspect, phrases in (
        ("pacing", "quick cuts|fast cuts|rapid cuts|long takes|slow motion|slow pacing|fast pacing"),
        (
            "other",
            "handheld camera|handheld|close-ups|close-up|closeups|drone shots|aerial shots|wide shots|"
            "film grain|golden hour|black and white|time-lapse|timelapse|lens flares|bokeh|shaky cam|static camera|"
            "voiceover|text overlays|cartoonish characters|jump cuts",
        ),
    )
    for phrase in phrases.split("|")
}
"""Items of several words (or words that are items only as a whole) the reader knows, and their aspect."""

NEUTRAL = frozenset(
    "a an the of with in on at to for by from into as about around throughout everywhere anywhere and or "
    "is are be am it's its it they them their i i'm i'd i've me my mine we we're we'd us our you you're your "
    "this that these those one ones something anything everything some any all every each "
    "very really so much lots lot bit little just also only always again now lately even quite pretty "
    "definitely absolutely totally super extra mostly mainly especially maybe perhaps probably overall "
    "please pls thanks thank cheers yes ok okay well honestly hmm oh hey lol whatsoever whatever think "
    "can could would will should do does let's lets make makes give see show have try ever using when there "
    "here way entirely completely forever next time batch last elements energy else".split()
)
"""Words that cannot turn a clause's polarity round (articles, pronouns, intensifiers, politeness, modal
verbs): with cues and style words they are all a clause the studio's reader accounts for may hold. A word
outside these, the cues and the style words (an unknown verb or adjective, a past tense, "than") makes the
clause not understood."""

TENSE_WORDS = frozenset(
    "was were had used once before previously formerly earlier past loved liked enjoyed wanted preferred "
    "hated disliked grew gotten become became anymore longer".split()
)
COMPARISON_WORDS = frozenset("than over compared better worse versus vs".split())
"""Words the reader names when it says why a clause was not understood: a tense shift, a comparison."""

CONTRAST = frozenset("but however instead though although whereas yet while rather".split())
"""Words that start a new clause with a polarity of its own ("I love blue but I can't stand yellow")."""

SUBJECTS = frozenset("i we you they it it's its that this he she".split())
"""A conjunction followed by one of these starts a new clause ("I don't like red and I love blue")."""

FILLER = frozenset(
    "tones tone aesthetics aesthetic shots shot cuts lighting colors colours color colour style styles vibe vibes "
    "videos video palette palettes look looks feel feeling atmosphere mood moods hues hue shades shade themes "
    "theme scenes scene stuff things thing kind sort light".split()
)
"""Words that name an aspect, not a preference: never an item on their own."""

STOP_WORDS = frozenset(
    "a an and or the of with in on at to for by from into as is are be its it this that these those "
    "any some all very really much so just".split()
)
"""Words that say nothing on their own."""

ENGLISH_GLUE = frozenset(
    "a an and or the of with in on at to for by from into as is are be been was were its it this that these "
    "those any some all very really much so just i me my we our you your they them their he she his her not "
    "no never but more less too please like love want prefer hate avoid without than instead use keep make "
    "more lots lot bit little always only also maybe would could should can don't do does did have has had "
    "one ones over under across through about same again what which who how when where there here yes "
    "pls lol forever go can could think long lately kind something everything anything whatever else".split()
)
"""Common English words: a clause with none of them, and words the reader does not know, is not read."""

CRAFT = frozenset(
    "shot shots close-up closeup wide aerial drone dolly tracking handheld pan panning tilt crane zoom focus "
    "depth field bokeh rack macro static composition framing angle low-angle overhead pov lens anamorphic "
    "light lighting lit backlit backlight rim glow golden hour mist haze fog volumetric shadows silhouette "
    "slow motion pacing steady smooth stable sharp detail texture grain film cinematic symmetrical "
    "painterly sweep orbit push-in pull-back long take".split()
)
"""Words of how a video is made (camera, light, pacing, finish): what a past success teaches another video."""

MEANINGS: dict[str, frozenset[str]] = {}
"""Each mood, pacing or theme word and the meaning groups it belongs to: brooding is moody, tranquil is
serene. A style item is carried by a word of one of its groups; opposites never share a group, which is
what the embedding model cannot tell apart (to MiniLM "cheerful" is nearer "gloomy" than "joyful")."""

for _group, _words in (
    (
        "dark",
        "dark darker darkness shadowy shadows shadow dim dimly dusky murky night nocturnal midnight noir "
        "low-key unlit pitch-black gloomy gloom moonlit twilight dusk sombre somber",
    ),
    (
        "moody",
        "moody brooding atmospheric melancholy melancholic somber sombre gloomy ominous foreboding stormy wistful",
    ),
    (
        "bright",
        "bright brighter brightly sunny luminous radiant sunlit brilliant dazzling high-key daylight "
        "well-lit light-filled",
    ),
    (
        "cheerful",
        "cheerful cheer cheery joyful happy upbeat playful lively merry jolly uplifting sunny bubbly festive joyous "
        "gleeful",
    ),
    (
        "serene",
        "serene calm tranquil peaceful still quiet quietly hushed placid gentle restful soothing meditative "
        "serenity calmness tranquillity",
    ),
    ("mysterious", "mysterious enigmatic mystical arcane cryptic secretive uncanny mystery"),
    ("epic", "epic grand majestic sweeping monumental heroic vast awe-inspiring colossal"),
    ("dreamy", "dreamy dreamlike ethereal hazy soft-focus surreal otherworldly"),
    ("gritty", "gritty raw grimy grungy dirty weathered rough"),
    ("whimsical", "whimsical playful quirky fanciful storybook fairy-tale"),
    ("melancholic", "melancholic melancholy wistful sorrowful mournful sad somber sombre forlorn elegiac"),
    ("energetic", "energetic lively vibrant frenetic high-energy kinetic"),
    ("eerie", "eerie spooky creepy haunting haunted uncanny unsettling sinister ghostly"),
    ("cosy", "cosy cozy snug homely inviting"),
    ("romantic", "romantic tender intimate passionate"),
    ("nostalgic", "nostalgic vintage retro wistful"),
    ("tense", "tense suspenseful taut gripping edgy"),
    ("dramatic", "dramatic intense striking theatrical"),
    ("vibrant", "vibrant vivid saturated colourful colorful"),
    ("warm", "warm warmth golden cosy cozy"),
    ("cold", "cold cool icy frosty chilly wintry frozen"),
    ("slow", "slow slowly lingering lingers linger unhurried leisurely languid slow-motion slow-paced unbroken"),
    ("fast", "fast faster quick quicker rapid frantic brisk swift snappy fast-paced breakneck hectic speed speedy"),
    ("underwater", "underwater undersea submerged"),
    ("space", "space cosmic galaxy nebula interstellar orbit"),
    ("forest", "forest woods woodland"),
    ("summer", "summer summery summertime"),
):
    for _word in _words.split():
        MEANINGS[_word] = MEANINGS.get(_word, frozenset()) | {_group}

FOREIGN_GLUE = frozenset(
    "de du des le les et ou pas ne jamais moins très avec sans une un est sont und oder nicht kein keine "
    "keinen mit ohne bitte der das dem sehr y el los las con sin por favor muy una nada il gli di e non mai "
    "senza più niente trop ein eine einem einen einer über unter zum zur auf aus bei vom ist sind del al sobre "
    "entre bajo como para pero lo os dos das em nas nos com sem um uma nel nella sul sulla tra fra nunca ni "
    "nie niemals weder nem não né".split()
)
"""Common words of French, German, Spanish, Italian and Portuguese: a sentence with one is not English the studio
reads, so its rules abstain rather than read "pas de violet" as liking violet."""


INTENSIFYING_CUES = ("too", "overly", "too much", "too many")
"""Rule-outs that only strengthen a rule-out before them ("nothing too sweet"), unless it is a plain "not"
("not too dark" is a little dark, not none: a second negation)."""

BACKWARD_NEGATIVE_CUES = ("not", "never", "no", "isn't", "aren't", "too much", "too many", "no thanks")
"""Rule-outs that also reach back to the clause's words before them ("red is not my thing")."""

COMPARING_CUES = ("rather", "prefer", "prefers", "preferably")
THAN_CUES = ("than", "over")
"""A preference by comparison rules out what follows "than" or "over" ("lavender rather than pink", "I
prefer calm over energetic"); "over" alone is a place ("a dragon over the sea")."""

DOUBLE_NEGATIVE_LIKES = (
    "wouldn't say no to",
    "would not say no to",
    "don't mind",
    "do not mind",
    "wouldn't mind",
    "no problem with",
)
"""Double negatives that like what follows."""

FEEDBACK_WORDS = frozenset(
    "prefer prefers like likes love loves want wants enjoy dislike hate favourite favorite i i'm me my we you "
    "please too not no never avoid without instead rather than less more fewer ever don't".split()
)
"""How feedback speaks (who likes, how much, no and not, more or less, one rather than another), never what
it prefers: "a bit too bright for me" or "blue instead of red" is the feedback handed back as an item, "bright"
ruled out is its reading."""

REQUEST_WORDS = frozenset(
    "task prompt reply json str write model video videos one create generate make new please".split()
)
"""Words of a request rather than of a scene: "Create a new video of dragons" asks for a video, it does not
describe one."""

ASPECT_ALIASES: dict[str, str] = {
    "color": "colour",
    "colors": "colour",
    "colours": "colour",
    "moods": "mood",
    "themes": "theme",
}
"""How a model may spell an aspect of a style item."""
