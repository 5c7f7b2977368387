"""The embedded Kafka-protocol brokers: tansu (`kafka-scorer broker`, the demo, the tests) and noida-db
for transactions. For trying the product and testing it; the serving path never imports them."""
