import sys

from kafka_scorer.cli import main

sys.exit(main())
