# Loaded first (ruby -r) by the tests' Ruby runs of a vendored Sidekiq
# (kt_ruby_v and kt_sidekiq_start_v in tests/helpers.c, which put its
# sources on RUBYLIB): loads Sidekiq, and stops when it is not the version
# KT_SIDEKIQ_VERSION names, so a test never passes on the wrong one.
want = ENV.fetch('KT_SIDEKIQ_VERSION')
if Gem::Version.new(want) >= Gem::Version.new('8.0') && RUBY_VERSION < '3.2'
  # Sidekiq 8 refuses Ruby < 3.2 and expects `set` loaded; Debian 12's
  # 3.1 runs what the tests use of it.
  Object.send(:remove_const, :RUBY_VERSION)
  RUBY_VERSION = '3.2.0'.freeze
  require 'set'
end
if Gem::Version.new(want) >= Gem::Version.new('8.1') && !defined?(Data.define)
  # What 8.1 uses of Ruby 3.2 and of newer default gems than Debian's:
  # Data.define (its API's value classes), Exception#detailed_message (its
  # default error handler) and URI::RFC2396_PARSER (its Web UI's router).
  require 'uri'
  class Data
    def self.define(*members, &block)
      Struct.new(*members, keyword_init: true, &block)
    end
  end
  class Exception
    def detailed_message(highlight: false, **)
      "#{message} (#{self.class})"
    end
  end
  URI::RFC2396_PARSER = URI::RFC2396_Parser.new unless defined?(URI::RFC2396_PARSER)
end
require 'sidekiq'
unless Sidekiq::VERSION == want
  abort("tests/ruby/sidekiq_version.rb: Sidekiq #{Sidekiq::VERSION} loaded, not #{want} " \
        "(RUBYLIB=#{ENV['RUBYLIB']})")
end
