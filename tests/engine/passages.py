"""Real English queries and passages for the cross-encoder tests: casing, punctuation, digits, accents,
quotes and dashes, as web passages have them. Written for these tests."""

QUERIES = [
    "What is the capital of California?",
    "how do rivers form deltas",
    "Who wrote 'Les Misérables'?",
    "best café in Zürich for a quick espresso",
    "Why does Kafka need a consumer group?",
    "symptoms of vitamin D deficiency",
    "When did the Berlin Wall fall?",
    "Is a tomato a fruit or a vegetable?",
    "How many kilometres long is the Rhine?",
    "naïve Bayes classifier: how does it work?",
    "cheap flights from São Paulo to Lisbon",
    "What's the difference between TCP and UDP?",
]

PASSAGES = [
    "Sacramento has been the capital of California since 1854; Los Angeles, however, is its largest city.",
    "A delta forms where a river slows down as it meets the sea, dropping the sand and silt it carried.",
    "Victor Hugo published Les Misérables in 1862. The novel follows Jean Valjean, an ex-convict.",
    "Our little café near Zürich's main station serves espresso, croissants and crème brûlée — until 6 p.m.",
    "Consumers in one group split a topic's partitions between them, so each record is processed once.",
    "Fatigue, bone pain and muscle weakness can all be signs that your vitamin D levels are low.",
    "On 9 November 1989 the border crossings opened, and Berliners began tearing down the Wall.",
    "Botanically, a tomato is a berry (a fruit); cooks, though, treat it as a vegetable.",
    "The Rhine runs about 1,230 km from the Swiss Alps to the North Sea, through six countries.",
    "Naïve Bayes assumes that features are independent given the class — a strong, often wrong, assumption.",
    "Fares from São Paulo (GRU) to Lisbon (LIS) start at R$ 2.100 in the low season.",
    "TCP guarantees ordered, reliable delivery; UDP sends datagrams with no handshake and no retries.",
    "The weather today: sunny, 24 °C, with a light breeze from the north-west.",
    "ERROR 404: page not found. Please check the URL and try again!",
]

LONG_PASSAGES = [" ".join(PASSAGES[i : i + 5]) for i in range(0, len(PASSAGES), 3)]
"""Several passages run together: long enough to be cut by a small pair limit."""
